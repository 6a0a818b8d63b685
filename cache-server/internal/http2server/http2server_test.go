package http2server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"
)

// BenchmarkEventBesideIdleStreams is one watch event (a 5 KiB write and a
// flush, read by the client) on one HTTP/2 connection that also holds
// idle streams — the tier's watch streams on a connection from the
// aggregator or a client — with the default write scheduler and with the
// one Configure sets. Its cost per event should not grow with the
// idle streams.
//
//	go test ./cache-server/internal/http2server -run X -bench EventBesideIdleStreams -count 5
func BenchmarkEventBesideIdleStreams(b *testing.B) {
	for _, sched := range []struct {
		name      string
		configure func(*http.Server) error
	}{
		{"roundrobin", func(srv *http.Server) error { return http2.ConfigureServer(srv, &http2.Server{}) }},
		{"configured", Configure},
	} {
		for _, idle := range []int{0, 200} {
			b.Run(fmt.Sprintf("scheduler=%s/idle=%d", sched.name, idle), func(b *testing.B) {
				benchEventBesideIdleStreams(b, sched.configure, idle)
			})
		}
	}
}

func benchEventBesideIdleStreams(b *testing.B, configure func(*http.Server) error, idle int) {
	event := []byte(strings.Repeat("x", 5<<10))
	var mu sync.Mutex
	signals := map[string]chan struct{}{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ch := signals[r.URL.Query().Get("id")]
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-ch:
				_, _ = w.Write(event)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	srv.EnableHTTP2 = true
	if err := configure(srv.Config); err != nil {
		b.Fatal(err)
	}
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()
	open := func(id string) (chan struct{}, io.ReadCloser) {
		ch := make(chan struct{}, 1)
		mu.Lock()
		signals[id] = ch
		mu.Unlock()
		resp, err := client.Get(srv.URL + "/?id=" + id)
		if err != nil {
			b.Fatal(err)
		}
		if resp.ProtoMajor != 2 {
			b.Fatalf("served over %s", resp.Proto)
		}
		return ch, resp.Body
	}
	// Under MaxConcurrentStreams (250): one connection holds them all.
	for i := range idle {
		_, body := open(fmt.Sprint("idle-", i))
		defer body.Close()
	}
	ch, body := open("active")
	defer body.Close()
	buf := make([]byte, len(event))
	b.SetBytes(int64(len(event)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		ch <- struct{}{}
		if _, err := io.ReadFull(body, buf); err != nil {
			b.Fatal(err)
		}
	}
}

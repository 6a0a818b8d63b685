package deadline

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/http2server"
)

// bigBody writes n bytes in 32 KiB chunks and reports how its handler
// ended.
type bigBody struct {
	n     int
	ended chan error
}

func (b bigBody) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	chunk := []byte(strings.Repeat("x", 32<<10))
	for written := 0; written < b.n; written += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			b.ended <- err
			return
		}
	}
	b.ended <- nil
}

// serve runs h behind Filter with the given verb in the RequestInfo, over
// TLS with HTTP/2 (http2) or HTTP/1.1.
func serve(t *testing.T, h http.Handler, verb string, timeout time.Duration, http2 bool, timedOut *atomic.Int32) *httptest.Server {
	t.Helper()
	f := Filter(h, timeout, func(*http.Request) { timedOut.Add(1) })
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.ServeHTTP(w, r.WithContext(request.WithRequestInfo(r.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: verb})))
	}))
	hs.EnableHTTP2 = http2
	if http2 {
		// The HTTP/2 server the roles run (x/net's).
		if err := http2server.Configure(hs.Config); err != nil {
			t.Fatal(err)
		}
	}
	hs.StartTLS()
	t.Cleanup(hs.Close)
	return hs
}

// TestSlowReaderIsCut: a client that stops reading a large body holds
// the handler (and what it holds) only until the deadline, over HTTP/2
// and HTTP/1.1; the timeout is reported.
func TestSlowReaderIsCut(t *testing.T) {
	for _, http2 := range []bool{true, false} {
		name := "HTTP/1.1"
		if http2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			body := bigBody{n: 256 << 20, ended: make(chan error, 1)}
			var timedOut atomic.Int32
			const timeout = time.Second
			hs := serve(t, body, "list", timeout, http2, &timedOut)
			resp, err := hs.Client().Get(hs.URL + "/api/v1/configmaps")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if (resp.ProtoMajor == 2) != http2 {
				t.Fatalf("served over %s", resp.Proto)
			}
			if _, err := io.ReadFull(resp.Body, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			select {
			case err := <-body.ended:
				if err == nil {
					t.Fatal("the whole body was written to a client that stopped reading")
				}
				if d := time.Since(start); d > 5*timeout {
					t.Errorf("the handler ended %s after the client stopped reading, the deadline is %s", d, timeout)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the handler still writes 30 s after the client stopped reading")
			}
			deadline := time.Now().Add(5 * time.Second)
			for timedOut.Load() != 1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := timedOut.Load(); n != 1 {
				t.Errorf("%d timeouts reported, want 1", n)
			}
			// The client sees the body end early.
			if _, err := io.Copy(io.Discard, resp.Body); err == nil {
				t.Error("the client read a whole body")
			}
		})
	}
}

// TestDeadlineDoesNotOutliveTheRequest: a request that ended in time
// leaves no deadline on its HTTP/1.1 connection for the next request,
// nor a timeout report.
func TestDeadlineDoesNotOutliveTheRequest(t *testing.T) {
	body := bigBody{n: 1 << 20, ended: make(chan error, 2)}
	var timedOut atomic.Int32
	const timeout = 300 * time.Millisecond
	hs := serve(t, body, "list", timeout, false, &timedOut)
	c := hs.Client()
	for i := range 2 {
		reused := false
		req, _ := http.NewRequest(http.MethodGet, hs.URL+"/api/v1/configmaps", nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && !reused {
			t.Fatal("the second request is not on the first one's connection")
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != 1<<20 {
			t.Fatalf("request %d: %d bytes, %v", i, n, err)
		}
		if err := <-body.ended; err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		// Longer than the deadline, on the same connection.
		time.Sleep(2 * timeout)
	}
	if n := timedOut.Load(); n != 0 {
		t.Errorf("%d timeouts reported", n)
	}
}

// TestWatchIsNotCut: a watch outlives the deadline (it has its own
// timeoutSeconds and slow-watcher bounds).
func TestWatchIsNotCut(t *testing.T) {
	var timedOut atomic.Int32
	const timeout = 200 * time.Millisecond
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for range 10 {
			if _, err := w.Write([]byte("{}\n")); err != nil {
				ended <- err
				return
			}
			if err := rc.Flush(); err != nil {
				ended <- err
				return
			}
			if _, ok := r.Context().Deadline(); ok {
				ended <- errors.New("a watch got a deadline")
				return
			}
			time.Sleep(timeout / 2)
		}
		ended <- nil
	})
	hs := serve(t, h, "watch", timeout, true, &timedOut)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+"/api/v1/configmaps?watch=true", nil)
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || len(b) != 30 {
		t.Fatalf("read %d bytes of the watch, %v", len(b), err)
	}
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	if n := timedOut.Load(); n != 0 {
		t.Errorf("%d timeouts reported", n)
	}
}

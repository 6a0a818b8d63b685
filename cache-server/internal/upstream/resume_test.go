package upstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// TestStreamErrorAfterSyncResumes: once synced, a broken upstream stream is
// resumed from the applied RV, not re-read. The stream that breaks here is
// the first one (the start-up watch-list's), which used to leave the
// ingester in "relist" mode: every connection reset re-read the resource.
func TestStreamErrorAfterSyncResumes(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		n := len(queries)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n == 1 {
			// The watch-list: one object, the initial-events-end
			// bookmark, then a line that is not an event.
			fmt.Fprintln(w, `{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":"10"}}}`)
			fmt.Fprintln(w, `{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"10","annotations":{"k8s.io/initial-events-end":"true"}}}}`)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
			fmt.Fprintln(w, `not an event`)
			return
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()

	st, err := store.New(store.Options{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	in := New(Options{
		Resource: Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
		Host:     srv.URL, Client: srv.Client(), Store: st, Metrics: m, Log: logr.Discard(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go in.Run(ctx)

	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := append([]string(nil), queries...)
		mu.Unlock()
		if len(got) >= 2 {
			if strings.Contains(got[1], "sendInitialEvents=true") || !strings.Contains(got[1], "resourceVersion=10") {
				t.Fatalf("after the stream broke the ingester sent %q; want a watch resuming from resourceVersion 10", got[1])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second request; requests: %q", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(m.UpstreamRelists.WithLabelValues("configmaps", "startup")); n != 1 {
		t.Fatalf("start-up relists: %v, want 1", n)
	}
}

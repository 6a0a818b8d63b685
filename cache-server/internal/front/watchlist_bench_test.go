package front

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
)

// BenchmarkWatchListGzip10kx1KiB serves a gzipped JSON watch-list of 10k
// ConfigMaps up to its initial-events-end bookmark (what client-go's
// informers ask for with WatchListClient on): chunks, with the compressed
// chunks kept between watch-lists (warm after the first); fresh, with none
// kept (every event compressed again, as before).
func BenchmarkWatchListGzip10kx1KiB(b *testing.B) {
	bt := newBenchTierFields(b, benchObjects(10000, 1024), true, true)
	defer bt.stop()
	fresh := New(Options{Resources: bt.srv.opts.Resources, Metrics: metrics.New(prometheus.NewRegistry()), Log: logr.Discard(), ListGzipCacheBytes: -1})
	target := benchPath + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	for _, c := range []struct {
		name string
		srv  *Server
	}{{"chunks", bt.srv}, {"fresh", fresh}} {
		b.Run(c.name, func(b *testing.B) {
			serve := func() int64 {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req := httptest.NewRequest(http.MethodGet, target, nil).WithContext(ctx)
				req.Header.Set("Accept", "application/json")
				req.Header.Set("Accept-Encoding", "gzip")
				w := &cutAtBookmark{h: http.Header{}, cancel: cancel}
				c.srv.ServeHTTP(w, req)
				if w.flushes < 2 || w.h.Get("Content-Encoding") != "gzip" {
					b.Fatalf("watch-list: %d flushes, Content-Encoding %q", w.flushes, w.h.Get("Content-Encoding"))
				}
				return w.n
			}
			wire := serve() // warm: the chunks kept, the pools filled
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
			b.ReportMetric(float64(wire), "wireB/op")
		})
	}
}

// cutAtBookmark is a watch-list's ResponseWriter that ends the request at
// its second flush: the first sends the headers, the second follows the
// initial-events-end bookmark.
type cutAtBookmark struct {
	h       http.Header
	n       int64
	flushes int
	cancel  func()
}

func (c *cutAtBookmark) Header() http.Header { return c.h }
func (c *cutAtBookmark) WriteHeader(int)     {}
func (c *cutAtBookmark) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}
func (c *cutAtBookmark) Flush() {
	if c.flushes++; c.flushes == 2 {
		c.cancel()
	}
}

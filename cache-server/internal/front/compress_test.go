package front

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
)

// The streamed JSON list is byte for byte the body encodeList builds, and
// jsonListLen predicts its length, for built-in and custom resources, items
// with and without the TypeMeta prefix, and empty lists.
func TestStreamedListMatchesEncodeList(t *testing.T) {
	res, objs := benchConfigMaps(&testing.B{}, 40, 5000) // 200 KB: above the gzip threshold
	res.bodies = newBodyWriters()
	odd := &store.Object{Key: "bench/odd", Raw: []byte(`{"metadata":{"name":"odd"}}`)}
	bare := &store.Object{Key: "bench/bare", Raw: []byte(`{"kind":"ConfigMap","apiVersion":"v1"}`)}
	cont := "tok"
	meta := metav1.ListMeta{ResourceVersion: "7", Continue: cont}
	// With gzipChunks the second LIST of the same objects is written from
	// the chunks the first kept; its body must be the same. The objects
	// get Seqs as a Store gives them; a scope per resource, as New makes
	// (the Custom switch below changes the bytes an object is written as).
	for i, o := range append([]*store.Object{odd, bare}, objs...) {
		o.Seq = uint64(i + 1)
	}
	chunkCounts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"resource", "result"})
	chunks := gzipchunks.New(0, gzipchunks.Metrics{
		Chunks:    chunkCounts,
		Bytes:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "b"}),
		Evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "e"}),
	})
	for _, variant := range []struct {
		custom, chunks bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		res.Entry.Custom = variant.custom
		res.gzipChunks = nil
		if variant.chunks {
			res.gzipChunks = chunks.Scope("configmaps")
		}
		custom := variant.custom
		for _, items := range [][]*store.Object{nil, {odd}, {bare, odd}, objs, objs[:2], objs} {
			want, err := encodeList(res, encJSON, meta, items)
			if err != nil {
				t.Fatal(err)
			}
			head, _ := jsonListHead("ConfigMapList", "v1", meta)
			if n := jsonListLen(res, head, items); n != len(want) {
				t.Errorf("custom=%v %d items: jsonListLen %d, body %d", custom, len(items), n, len(want))
			}
			for _, ae := range []string{"", "gzip", "deflate, gzip", "gzip;q=1.0", "br"} {
				req := httptest.NewRequest(http.MethodGet, "/api/v1/configmaps", nil)
				if ae != "" {
					req.Header.Set("Accept-Encoding", ae)
				}
				rec := httptest.NewRecorder()
				if code := (&Server{}).writeList(rec, req, res, encJSON, meta, items); code != http.StatusOK {
					t.Fatalf("code %d", code)
				}
				gz := (ae == "gzip" || ae == "deflate, gzip") && len(want) > gzipThreshold
				got := rec.Body.Bytes()
				if ce := rec.Header().Get("Content-Encoding"); (ce == "gzip") != gz {
					t.Fatalf("Accept-Encoding %q, %d bytes: Content-Encoding %q", ae, len(want), ce)
				}
				if gz {
					if rec.Header().Get("Vary") != "Accept-Encoding" {
						t.Errorf("Vary %q", rec.Header().Get("Vary"))
					}
					zr, err := gzip.NewReader(bytes.NewReader(got))
					if err != nil {
						t.Fatal(err)
					}
					if got, err = io.ReadAll(zr); err != nil {
						t.Fatal(err)
					}
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("custom=%v %d items, Accept-Encoding %q: streamed body differs (%d vs %d bytes)", custom, len(items), ae, len(got), len(want))
				}
				if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
			}
		}
	}
	if hits := testutil.ToFloat64(chunkCounts.WithLabelValues("configmaps", "hit")); hits == 0 {
		t.Error("no LIST was written from kept chunks")
	}
}

// Bodies built in memory (GET, other list forms) follow the same rule.
func TestWriteBodyCompression(t *testing.T) {
	b := newBodyWriters()
	for _, size := range []int{10, gzipThreshold, gzipThreshold + 1} {
		body := bytes.Repeat([]byte("a"), size)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		rec := httptest.NewRecorder()
		b.write(rec, acceptsGzip(req), encJSON, body)
		got := rec.Body.Bytes()
		if gz := rec.Header().Get("Content-Encoding") == "gzip"; gz != (size > gzipThreshold) {
			t.Fatalf("%d bytes: gzip %v", size, gz)
		} else if gz {
			zr, _ := gzip.NewReader(bytes.NewReader(got))
			got, _ = io.ReadAll(zr)
		}
		if !bytes.Equal(got, body) {
			t.Fatalf("%d bytes: body differs", size)
		}
	}
}

func TestJSONListLonger(t *testing.T) {
	res, objs := benchConfigMaps(&testing.B{}, 30, 100)
	head, _ := jsonListHead("ConfigMapList", "v1", metav1.ListMeta{ResourceVersion: "1"})
	for _, k := range []int{0, 1, 2, 29, 30} {
		size := jsonListLen(res, head, objs[:k])
		for _, n := range []int{0, size - 1, size, size + 1} {
			if got := jsonListLonger(res, head, objs[:k], n); got != (size > n) {
				t.Errorf("%d items (%d bytes), n=%d: %v", k, size, n, got)
			}
		}
	}
}

// Chunks are kept unless the budget is negative: by Store Seq for a
// LocalSource's resources, by content for another Source's (a fleet's
// front: its items come from shards, their Seqs are not its own). The
// chunk counters exist at 0 for every resource either way: the
// dashboard's panel shows no hits rather than no data.
func TestListGzipChunksKeyedBySource(t *testing.T) {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	for _, c := range []struct {
		source          Source
		budget          int64
		kept, byContent bool
	}{{LocalSource{}, 0, true, false}, {LocalSource{}, -1, false, false}, {nil, 0, true, true}, {nil, -1, false, false}} {
		m := metrics.New(prometheus.NewRegistry())
		s := New(Options{
			Resources: []Resource{{Source: c.source, Entry: catalog.Entry{
				Resource:    upstream.Resource{GVR: gvr, Kind: "ConfigMap", Namespaced: true},
				APIResource: metav1.APIResource{Name: "configmaps", Kind: "ConfigMap", Namespaced: true},
			}}},
			Metrics: m, Log: logr.Discard(), ListGzipCacheBytes: c.budget,
		})
		res := s.resources[gvr]
		if kept := res.gzipChunks != nil && res.watchListChunks != nil; kept != c.kept || res.chunksByContent != c.byContent {
			t.Errorf("source %T, budget %d: chunks kept %v by content %v, want %v %v", c.source, c.budget, kept, res.chunksByContent, c.kept, c.byContent)
		}
		if n := testutil.CollectAndCount(m.ListGzipChunks); n != 2 {
			t.Errorf("source %T, budget %d: %d chunk series, want hit and miss", c.source, c.budget, n)
		}
	}
}

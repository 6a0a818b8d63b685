package front

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A fleet's front (items handed over one at a time from a reused buffer,
// without Seqs) writes gzipped JSON LISTs and watch-lists from chunks kept
// by content: the second LIST or watch-list of unchanged objects
// compresses nothing again, and every body decodes to what the standalone
// server writes for the same objects (the LIST) or to the same stream
// uncompressed (the watch-list).
func TestFrontKeepsChunksByContent(t *testing.T) {
	const n = 2000
	bt := newBenchTierFields(t, benchObjects(n, 1024), true, true)
	fleet, lists := fleetServer(t, bt, nil)
	if !fleet.resources[bt.ing.Resource().GVR].chunksByContent {
		t.Fatal("the front's resource does not keep chunks by content")
	}
	chunks := func(result string) float64 {
		return testutil.ToFloat64(fleet.opts.Metrics.ListGzipChunks.WithLabelValues("configmaps", result))
	}

	want := serve(t, bt.srv, benchPath, "gzip")
	var misses float64
	for i, name := range []string{"cold", "warm"} {
		got := serve(t, fleet, benchPath, "gzip")
		if got.code != want.code || got.ce != "gzip" || !bytes.Equal(got.body, want.body) {
			t.Fatalf("%s LIST: %d %q, %d bytes, want %d gzip, the standalone server's %d bytes", name, got.code, got.ce, len(got.body), want.code, len(want.body))
		}
		switch i {
		case 0:
			misses = chunks("miss")
			if misses < n/chunkItemsApprox/2 || chunks("hit") != 0 {
				t.Fatalf("cold LIST: %v chunks compressed, %v from the cache; want ~%d compressed", misses, chunks("hit"), n/chunkItemsApprox)
			}
		case 1:
			if chunks("miss") != misses || chunks("hit") != misses {
				t.Fatalf("warm LIST: %v more compressed, %v from the cache; want 0 and %v", chunks("miss")-misses, chunks("hit"), misses)
			}
		}
	}
	if lists.Load() != 0 {
		t.Fatalf("the front collected %d LISTs", lists.Load())
	}

	tier := httptest.NewServer(fleet)
	t.Cleanup(func() {
		tier.CloseClientConnections()
		tier.Close()
		bt.stop()
	})
	url := tier.URL + benchPath + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	plain := readWatchHead(t, url, "application/json", "", 0)
	listHits, listMisses := chunks("hit"), chunks("miss")
	cold := readWatchHead(t, url, "application/json", "gzip", 0)
	if cold.contentEncoding != "gzip" || !bytes.Equal(cold.frames, plain.frames) {
		t.Fatalf("first gzipped watch-list: Content-Encoding %q, frames equal to the plain ones: %v", cold.contentEncoding, bytes.Equal(cold.frames, plain.frames))
	}
	wlMisses := chunks("miss") - listMisses
	if wlMisses < n/chunkItemsApprox/2 || chunks("hit") != listHits {
		t.Fatalf("first gzipped watch-list: %v chunks compressed, %v from the cache; want ~%d compressed", wlMisses, chunks("hit")-listHits, n/chunkItemsApprox)
	}
	warm := readWatchHead(t, url, "application/json", "gzip", 0)
	if !bytes.Equal(warm.frames, plain.frames) {
		t.Fatal("second gzipped watch-list: frames differ from the plain ones")
	}
	if got := chunks("miss") - listMisses; got != wlMisses || chunks("hit")-listHits != wlMisses {
		t.Fatalf("second gzipped watch-list: %v more compressed, %v from the cache; want 0 and %v", got-wlMisses, chunks("hit")-listHits, wlMisses)
	}
}

// A front's gzipped RV=0 LIST of 10k x 1 KiB ConfigMaps, handed over item
// by item as from the shards (localStreamer: the store's items, without
// their Seqs): from chunks kept by content with the items' content hashes
// as shards send them, the same hashed by the front (shards that send
// none), and compressed whole as before chunks were kept (the resource's
// chunksByContent off).
func benchFrontListGzip(b *testing.B, keep, hashed bool) {
	bt := newBenchTier(b, benchObjects(10000, 1024))
	defer bt.stop()
	fleet := serverOver(b, bt, localStreamer{LocalSource: LocalSource{Ingester: bt.ing}, unhashed: !hashed})
	fleet.resources[bt.ing.Resource().GVR].chunksByContent = keep
	front := &benchTier{srv: fleet}
	body := &bytes.Buffer{}
	header := http.Header{"Accept-Encoding": {"gzip"}}
	front.get(b, body, benchPath+"?resourceVersion=0", nil)
	plain := body.Len()
	front.get(b, body, benchPath+"?resourceVersion=0", header)
	b.ReportAllocs()
	for b.Loop() {
		front.get(b, body, benchPath+"?resourceVersion=0", header)
	}
	b.SetBytes(int64(plain))
	b.ReportMetric(float64(body.Len()), "wireB/op")
}

func BenchmarkFrontListGzipKept10kx1KiB(b *testing.B) { benchFrontListGzip(b, true, true) }
func BenchmarkFrontListGzipKeptFrontHashes10kx1KiB(b *testing.B) {
	benchFrontListGzip(b, true, false)
}
func BenchmarkFrontListGzipWhole10kx1KiB(b *testing.B) { benchFrontListGzip(b, false, true) }

// A front compresses a LIST exactly when the standalone server does: a
// body of gzipThreshold bytes or less is plain, one byte more is gzipped
// (the chunked body counts each item's bytes as written, without the
// apiVersion/kind prefix it drops).
func TestFrontGzipThresholdEdge(t *testing.T) {
	const probe = gzipThreshold - 400
	bt := newBenchTierFields(t, benchObjects(1, probe), true, false)
	base := len(serve(t, bt.srv, benchPath, "").body)
	bt.stop()
	for _, want := range []int{gzipThreshold - 30, gzipThreshold - 1, gzipThreshold, gzipThreshold + 1, gzipThreshold + 30} {
		bt := newBenchTierFields(t, benchObjects(1, probe+want-base), true, false)
		plain := serve(t, bt.srv, benchPath, "")
		if len(plain.body) != want {
			t.Fatalf("a body of %d bytes, want %d: the probe's arithmetic is off", len(plain.body), want)
		}
		standalone := serve(t, bt.srv, benchPath, "gzip")
		front := serve(t, streamingServer(t, bt, nil), benchPath, "gzip")
		if front.ce != standalone.ce || !bytes.Equal(front.body, standalone.body) {
			t.Errorf("a body of %d bytes: the front's Content-Encoding %q, the standalone server's %q (bodies equal: %v)", want, front.ce, standalone.ce, bytes.Equal(front.body, standalone.body))
		}
		if gz := standalone.ce == "gzip"; gz != (want > gzipThreshold) {
			t.Errorf("a body of %d bytes: gzipped %v", want, gz)
		}
		bt.stop()
	}
}

package front

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/fields"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
)

// localStreamer is a LocalSource that is also an ItemStreamer: the
// store's page handed out item by item. Serving the same store through it
// and through LocalSource compares the streamed path with the collected
// one on identical data. fail, when set, is asked before each item.
type localStreamer struct {
	LocalSource
	fail func(item int) error
	// unhashed hands items over without their content hashes, as from
	// shards that send none.
	unhashed bool
}

func (l localStreamer) StreamItems(req store.ListRequest, head func(rv uint64) error, item func(raw []byte, contentHash uint64) error) (store.ListResult, error) {
	res, err := l.List(req)
	if err != nil {
		return store.ListResult{}, err
	}
	if head != nil {
		if err := head(res.RV); err != nil {
			return store.ListResult{}, err
		}
	}
	for i, o := range res.Items {
		if l.fail != nil {
			if err := l.fail(i); err != nil {
				return store.ListResult{}, err
			}
		}
		hash := o.ContentHash
		if l.unhashed {
			hash = 0
		}
		if err := item(o.Raw, hash); err != nil {
			return store.ListResult{}, err
		}
	}
	res.Items = nil
	return res, nil
}

// streamingServer is a Server over t's ingester whose source streams.
func streamingServer(t testing.TB, bt *benchTier, fail func(int) error) *Server {
	t.Helper()
	return serverOver(t, bt, localStreamer{LocalSource: LocalSource{Ingester: bt.ing}, fail: fail})
}

// serverOver is a Server of bt's ConfigMaps read from src, with the
// apiserver's ConfigMap printer and bt's watch hub, if it has one.
func serverOver(t testing.TB, bt *benchTier, src Source) *Server {
	t.Helper()
	res := bt.ing.Resource()
	fr, err := fields.New(fields.Spec{GVR: res.GVR, Kind: res.Kind, Namespaced: res.Namespaced})
	if err != nil {
		t.Fatal(err)
	}
	return New(Options{
		Resources: []Resource{{
			Entry: catalog.Entry{
				Resource:    res,
				APIResource: metav1.APIResource{Name: "configmaps", Kind: "ConfigMap", Namespaced: true, Verbs: []string{"get", "list", "watch"}},
				Fields:      fr,
			},
			Source:  src,
			Hub:     bt.srv.resources[res.GVR].Hub,
			Printer: tables.NewBuiltins().For(res.GVR, "ConfigMap"),
		}},
		Metrics: metrics.New(prometheus.NewRegistry()), Log: logr.Discard(),
	})
}

type served struct {
	code            int
	contentType, ce string
	body            []byte // decompressed
}

func serve(t *testing.T, h http.Handler, target, acceptEncoding string) served {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Accept", "application/json")
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	s := served{code: rec.Code, contentType: rec.Header().Get("Content-Type"), ce: rec.Header().Get("Content-Encoding"), body: rec.Body.Bytes()}
	if s.ce == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(s.body))
		if err != nil {
			t.Fatal(err)
		}
		if s.body, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// continueOf is a list body's metadata.continue.
func continueOf(t *testing.T, body []byte) string {
	var l struct {
		Metadata metav1.ListMeta `json:"metadata"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("%v: %.200s", err, body)
	}
	return l.Metadata.Continue
}

// Streamed lists are byte for byte the collected ones: whole lists (below
// and above the gzip threshold), every page of paginated walks, with and
// without selectors and gzip.
func TestStreamedListMatchesCollected(t *testing.T) {
	for _, size := range []int{100, 5000} { // 40 objects: ~10 KB and ~240 KB
		bt := newBenchTierFields(t, benchObjects(40, size), true, false)
		streaming := streamingServer(t, bt, nil)
		for _, path := range []string{benchPath, "/api/v1/configmaps"} {
			for _, query := range []string{"", "?limit=1", "?limit=7", "?limit=39", "?limit=40", "?limit=500",
				"?fieldSelector=metadata.name%3Dcm-000003", "?fieldSelector=metadata.name!%3Dcm-000003&limit=13", "?labelSelector=none%3Dx&limit=3",
				"?resourceVersion=0", "?resourceVersion=0&limit=5"} {
				for _, ae := range []string{"", "gzip"} {
					target := path + query
					for page := 0; ; page++ {
						want := serve(t, bt.srv, target, ae)
						got := serve(t, streaming, target, ae)
						if got.code != want.code || got.ce != want.ce || got.contentType != want.contentType || !bytes.Equal(got.body, want.body) {
							t.Fatalf("size %d %s (Accept-Encoding %q) page %d: got %d %q %q %d bytes, want %d %q %q %d bytes:\n%.300s\n%.300s",
								size, target, ae, page, got.code, got.ce, got.contentType, len(got.body), want.code, want.ce, want.contentType, len(want.body), got.body, want.body)
						}
						if want.code != http.StatusOK {
							t.Fatalf("%s: %d %s", target, want.code, want.body)
						}
						cont := continueOf(t, want.body)
						if cont == "" {
							break
						}
						// The next page: the same query with the token
						// (which carries the RV).
						q, _ := url.ParseQuery(strings.TrimPrefix(query, "?"))
						q.Del("resourceVersion")
						q.Set("continue", cont)
						target = path + "?" + q.Encode()
					}
				}
			}
		}
		bt.stop()
	}
}

// A list that fails before the body passed the gzip threshold gets its
// Status; after, the response is aborted (never a well-formed short list).
func TestStreamedListFailure(t *testing.T) {
	bt := newBenchTierFields(t, benchObjects(200, 5000), true, false) // ~1 MB
	defer bt.stop()
	boom := errors.New("shard gone")
	for _, c := range []struct {
		failAt int
		abort  bool
	}{{0, false}, {3, false}, {150, true}} {
		srv := streamingServer(t, bt, func(i int) error {
			if i == c.failAt {
				return boom
			}
			return nil
		})
		for _, query := range []string{"", "?limit=190"} {
			var got served
			aborted := func() (aborted bool) {
				defer func() {
					if r := recover(); r != nil {
						if r != http.ErrAbortHandler {
							panic(r)
						}
						aborted = true
					}
				}()
				got = serve(t, srv, benchPath+query, "gzip")
				return false
			}()
			// A page is collected before anything is written: always a
			// Status.
			wantAbort := c.abort && query == ""
			if aborted != wantAbort {
				t.Fatalf("fail at %d %q: aborted %v, want %v", c.failAt, query, aborted, wantAbort)
			}
			if !aborted && (got.code != http.StatusInternalServerError || !bytes.Contains(got.body, []byte("shard gone"))) {
				t.Fatalf("fail at %d %q: %d %s", c.failAt, query, got.code, got.body)
			}
		}
	}
}

// A deferred body is compressed exactly when it is longer than the
// threshold, however it was written (pieces, single bytes, one write).
func TestDeferredBody(t *testing.T) {
	b := newBodyWriters()
	for _, size := range []int{0, 10, gzipThreshold - 1, gzipThreshold, gzipThreshold + 1, 3 * gzipThreshold} {
		body := bytes.Repeat([]byte("0123456789"), size/10+1)[:size]
		for _, piece := range []int{1, 7, 4096, size + 1} {
			rec := httptest.NewRecorder()
			d := b.deferred(rec, true, encJSON)
			for off := 0; off < size; off += piece {
				chunk := body[off:min(off+piece, size)]
				if len(chunk) == 1 {
					_ = d.WriteByte(chunk[0])
				} else {
					_, _ = d.Write(chunk)
				}
			}
			if err := d.finish(); err != nil {
				t.Fatal(err)
			}
			got := rec.Body.Bytes()
			gz := rec.Header().Get("Content-Encoding") == "gzip"
			if gz != (size > gzipThreshold) {
				t.Fatalf("%d bytes in pieces of %d: gzip %v", size, piece, gz)
			}
			if gz {
				zr, err := gzip.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				got, _ = io.ReadAll(zr)
			}
			if !bytes.Equal(got, body) || rec.Code != http.StatusOK {
				t.Fatalf("%d bytes in pieces of %d: %d, body differs", size, piece, rec.Code)
			}
		}
	}
}

package front

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// copyingStreamer is a fleet front's Source as the front sees it, over a
// LocalSource: List returns copies of the items (fleet.Source.List builds
// objects of its own from the shards' answers, which the request then
// holds), StreamItems hands out each item's bytes in one reused buffer
// that is overwritten after each call (a shard's stream being read), so a
// form that keeps an item beyond its call writes garbage. Its bodies are
// comparable byte for byte with the standalone server's on the same store.
type copyingStreamer struct {
	LocalSource
	// edit, when set, gives item i's bytes (an object a form cannot
	// encode) or the read's failure there (a shard lost).
	edit  func(i int, raw []byte) ([]byte, error)
	lists *atomic.Int32 // calls of List: the collected path
}

func (c copyingStreamer) item(i int, raw []byte) ([]byte, error) {
	if c.edit == nil {
		return raw, nil
	}
	return c.edit(i, raw)
}

func (c copyingStreamer) List(req store.ListRequest) (store.ListResult, error) {
	c.lists.Add(1)
	res, err := c.LocalSource.List(req)
	if err != nil {
		return res, err
	}
	items := make([]*store.Object, len(res.Items))
	for i, o := range res.Items {
		raw, err := c.item(i, o.Raw)
		if err != nil {
			return store.ListResult{}, err
		}
		cp := *o
		cp.Raw = bytes.Clone(raw)
		items[i] = &cp
	}
	res.Items = items
	return res, nil
}

func (c copyingStreamer) StreamItems(req store.ListRequest, head func(rv uint64) error, item func(raw []byte, contentHash uint64) error) (store.ListResult, error) {
	res, err := c.LocalSource.List(req)
	if err != nil {
		return store.ListResult{}, err
	}
	if head != nil {
		if err := head(res.RV); err != nil {
			return store.ListResult{}, err
		}
	}
	var buf []byte
	for i, o := range res.Items {
		raw, err := c.item(i, o.Raw)
		if err != nil {
			return store.ListResult{}, err
		}
		buf = append(buf[:0], raw...)
		hash := o.ContentHash
		if c.edit != nil {
			hash = 0 // the bytes may have changed
		}
		err = item(buf, hash)
		for j := range buf {
			buf[j] = 'X'
		}
		if err != nil {
			return store.ListResult{}, err
		}
	}
	res.Items = nil
	return res, nil
}

// fleetServer is a Server of bt's ConfigMaps read through a
// copyingStreamer, and the streamer's count of collected reads.
func fleetServer(t testing.TB, bt *benchTier, edit func(int, []byte) ([]byte, error)) (*Server, *atomic.Int32) {
	lists := new(atomic.Int32)
	return serverOver(t, bt, copyingStreamer{LocalSource: LocalSource{Ingester: bt.ing}, edit: edit, lists: lists}), lists
}

// serveForm is serve with form f's Accept header, its Table options added
// to query.
func serveForm(t *testing.T, h http.Handler, f listForm, query url.Values, acceptEncoding string) served {
	t.Helper()
	q, _ := url.ParseQuery(strings.TrimPrefix(f.query, "?"))
	for k, v := range query {
		q[k] = v
	}
	req := httptest.NewRequest(http.MethodGet, benchPath+"?"+q.Encode(), nil)
	req.Header.Set("Accept", f.accept)
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	s := served{code: rec.Code, contentType: rec.Header().Get("Content-Type"), ce: rec.Header().Get("Content-Encoding"), body: rec.Body.Bytes()}
	if s.ce == "gzip" {
		s.body = gunzip(t, s.body)
	}
	return s
}

// streamedOnFleet: the forms a fleet front streams from StreamItems (the
// others are collected, see serveList).
func streamedOnFleet(f listForm) bool { return !f.enc.isProtobuf() }

// TestFleetListFormsMatchCollected: a fleet front's metadata-only and
// Table LISTs of 10,000 objects, streamed from StreamItems, are byte for
// byte the bodies the collected path writes for the same objects (the
// standalone server's writeList) — whole lists and every page of
// paginated walks, plain and gzipped by the same threshold — and they
// are streamed: the source's List is never called for them (the
// protobuf forms, collected, are compared too).
func TestFleetListFormsMatchCollected(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	bt := newBenchTierFields(t, benchObjects(n, 1024), true, false)
	defer bt.stop()
	configMapsWithPrinter(bt) // the Tables need the printer
	fleet, lists := fleetServer(t, bt, nil)
	for _, f := range listForms {
		for _, query := range []string{"", "limit=500", "limit=7", "fieldSelector=metadata.name%3Dcm-000003", "limit=40&fieldSelector=metadata.name!%3Dcm-000003", "labelSelector=none%3Dx", "labelSelector=none%3Dx&limit=3", "resourceVersion=0&limit=3"} {
			for _, ae := range []string{"", "gzip"} {
				q, _ := url.ParseQuery(query)
				lists.Store(0)
				for page := 0; page < 4 || q.Get("limit") == "500"; page++ {
					want := serveForm(t, bt.srv, f, q, ae)
					got := serveForm(t, fleet, f, q, ae)
					if got.code != want.code || got.ce != want.ce || got.contentType != want.contentType || !bytes.Equal(got.body, want.body) {
						t.Fatalf("%s ?%s (Accept-Encoding %q) page %d: got %d %q %q %d bytes, want %d %q %q %d bytes:\n%.300s\n%.300s",
							f.name, q.Encode(), ae, page, got.code, got.ce, got.contentType, len(got.body), want.code, want.ce, want.contentType, len(want.body), got.body, want.body)
					}
					if want.code != http.StatusOK {
						t.Fatalf("%s ?%s: %d %s", f.name, q.Encode(), want.code, want.body)
					}
					if f.enc.isProtobuf() {
						break // its continue token is not read here: the first page only
					}
					cont := continueOf(t, want.body)
					if cont == "" {
						break
					}
					q.Del("resourceVersion")
					q.Set("continue", cont)
				}
				if collected := lists.Load() > 0; collected == streamedOnFleet(f) {
					t.Fatalf("%s ?%s: the fleet front called List %d times", f.name, query, lists.Load())
				}
			}
		}
	}
}

// serveAborted is serveForm that reports an aborted response (ServeHTTP
// panics with http.ErrAbortHandler) instead of its answer.
func serveAborted(t *testing.T, h http.Handler, f listForm, query url.Values) (got served, aborted bool) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			aborted = true
		}
	}()
	return serveForm(t, h, f, query, "gzip"), false
}

// TestFleetListFormFailures: on a fleet front, a streamed metadata-only
// or Table LIST that fails while nothing was sent — an object that does
// not encode, a shard lost — answers its Status (the object's 500
// InternalError, the read's error as listError makes it); one that fails
// after part of the body was sent is aborted, never completed without
// the object; a page is written only once read, so it always gets its
// Status.
func TestFleetListFormFailures(t *testing.T) {
	const n = 1000 // every streamed body passes the gzip threshold, but Table None's
	bt := newBenchTierFields(t, benchObjects(n, 1024), true, false)
	defer bt.stop()
	// Not JSON: no form can encode it. data that is not a map: the
	// metadata form can, the printer cannot.
	broken := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":`)
	badData := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-bad","namespace":"bench","resourceVersion":"7","creationTimestamp":"2026-11-21T10:00:00Z"},"data":7}`)
	shardGone := errors.New("shard gone")
	for _, f := range listForms {
		if !streamedOnFleet(f) {
			continue
		}
		bad := badData
		if f.enc.isPartialMetadata() {
			bad = broken
		}
		for _, c := range []struct {
			name   string
			at     int
			shard  bool // the read fails, not the object
			status int  // 0: aborted
		}{
			{"bad first", 0, false, http.StatusInternalServerError},
			{"bad last", n - 1, false, 0},
			{"shard lost at first", 0, true, http.StatusInternalServerError},
			{"shard lost at last", n - 1, true, 0},
		} {
			srv, _ := fleetServer(t, bt, func(i int, raw []byte) ([]byte, error) {
				switch {
				case i != c.at:
					return raw, nil
				case c.shard:
					return nil, shardGone
				}
				return bad, nil
			})
			for _, query := range []url.Values{{}, {"limit": {"500"}}, {"limit": {"2000"}}} {
				want := c.status
				if query.Get("limit") != "" || f.query == "?includeObject=None" {
					// A page is read before anything is written; Table
					// None's rows are under the threshold until the last.
					want = http.StatusInternalServerError
				}
				if query.Get("limit") == "500" && c.at == n-1 {
					want = http.StatusOK // the bad item is not on the first page
				}
				got, aborted := serveAborted(t, srv, f, query)
				switch {
				case want == 0 && !aborted:
					t.Errorf("%s, %s ?%s: %d, want aborted", f.name, c.name, query.Encode(), got.code)
				case want == 0:
				case aborted:
					t.Errorf("%s, %s ?%s: aborted, want %d", f.name, c.name, query.Encode(), want)
				case got.code != want:
					t.Errorf("%s, %s ?%s: %d %.200s, want %d", f.name, c.name, query.Encode(), got.code, got.body, want)
				case want == http.StatusOK:
				case c.shard && !bytes.Contains(got.body, []byte("shard gone")), !c.shard && !bytes.Contains(got.body, []byte("InternalError")):
					t.Errorf("%s, %s ?%s: %s", f.name, c.name, query.Encode(), got.body)
				}
			}
		}
	}
}

// TestFleetListMemoryBound: a fleet front's metadata-only and Table LISTs
// of 10,000 ConfigMaps of ~1.4 KiB hold what TestListMemoryBound allows
// the standalone server — a quarter of the body, 512 KiB for Table None —
// beyond what was live before the request. Collected (Source.List's
// copies, as before they were streamed) they held every object again:
// 14 MiB more.
func TestFleetListMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 objects and a collection per write")
	}
	bt := newBenchTierFields(t, benchObjects(10000, 1024), true, false)
	defer bt.stop()
	fleet, lists := fleetServer(t, bt, nil)
	for _, f := range listForms {
		if !streamedOnFleet(f) {
			continue
		}
		checkHeldBound(t, fleet, f)
	}
	if lists.Load() != 0 {
		t.Errorf("the fleet front collected %d LISTs", lists.Load())
	}
}

package shardwire

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// --- helpers ---------------------------------------------------------------

func testObj(key string, rv uint64, raw []byte) *store.Object {
	ns, name, _ := strings.Cut(key, "/")
	return &store.Object{Key: key, Namespace: ns, Name: name, RV: rv, Raw: raw}
}

// sameObject compares objects the way the wire promises to keep them: an
// empty map or byte slice and a nil one are the same.
func sameObject(a, b *store.Object) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Key == b.Key && a.Namespace == b.Namespace && a.Name == b.Name && a.RV == b.RV &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Fields, b.Fields) && bytes.Equal(a.Raw, b.Raw) &&
		a.ContentHash == b.ContentHash
}

func describe(o *store.Object) string {
	if o == nil {
		return "<nil>"
	}
	raw := o.Raw
	if len(raw) > 64 {
		raw = raw[:64]
	}
	return fmt.Sprintf("{%q %q %q rv=%d l=%v f=%v raw(%d)=%q hash=%x}", o.Key, o.Namespace, o.Name, o.RV, o.Labels, o.Fields, len(o.Raw), raw, o.ContentHash)
}

// encode runs fn on a Writer and returns the bytes written.
func encode(t testing.TB, fn func(w *Writer) error) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := fn(w); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return buf.Bytes()
}

// decodeOne decodes exactly one record followed by a clean end.
func decodeOne(t testing.TB, data []byte) Record {
	t.Helper()
	r := NewReader(bytes.NewReader(data))
	rec, err := r.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the record: want io.EOF, got %v", err)
	}
	return rec
}

// invalidUTF8 is raw bytes that are not valid UTF-8 (and not JSON): the
// wire must carry them untouched.
var invalidUTF8 = []byte{0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1, '"', '\\', 0x80}

// --- round trips -------------------------------------------------------------

func TestObjectRoundTrip(t *testing.T) {
	big := make([]byte, 1<<20+7)
	for i := range big {
		big[i] = byte(i * 31)
	}
	cases := map[string]*store.Object{
		"plain": testObj("ns/a", 7, []byte(`{"kind":"ConfigMap","metadata":{"name":"a"}}`)),
		"labels and fields": {
			Key: "ns/b", Namespace: "ns", Name: "b", RV: 1<<63 + 5,
			Labels: map[string]string{"app": "x", "tier": "", "example.com/long-key": "v"},
			Fields: map[string]string{"spec.nodeName": "node-1", "status.phase": "Running"},
			Raw:    []byte(`{"a":1}`),
		},
		"cluster-scoped":   {Key: "/c", Name: "c", RV: 1, Raw: []byte("{}")},
		"invalid utf-8":    testObj("ns/bin", 9, invalidUTF8),
		"empty raw":        testObj("ns/empty", 3, nil),
		"1 MiB raw":        testObj("ns/big", 11, big),
		"unicode metadata": {Key: "ns/é", Namespace: "ns", Name: "é", RV: 2, Labels: map[string]string{"k": "ü\u2028"}, Raw: []byte("x")},
	}
	// With its content hash: sent when the front asked, else not.
	hashed := *cases["labels and fields"]
	hashed.ContentHash = store.HashContent(hashed.Raw)
	cases["content hash sent"] = &hashed
	unsent := hashed
	cases["content hash not asked for"] = &unsent
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			want := o
			if name == "content hash not asked for" {
				c := *o
				c.ContentHash = 0
				want = &c
			}
			rec := decodeOne(t, encode(t, func(w *Writer) error {
				if name != "content hash not asked for" {
					w.SendContentHashes()
				}
				return w.Object(o)
			}))
			if rec.Kind != KindObject {
				t.Fatalf("kind %q", rec.Kind)
			}
			if !sameObject(rec.Object, want) {
				t.Fatalf("got  %s\nwant %s", describe(rec.Object), describe(want))
			}
			if rec.Prev != nil {
				t.Fatalf("object record with a prev: %s", describe(rec.Prev))
			}
			if rec.Header.Object == nil || rec.Header.Object.Key != o.Key {
				t.Fatalf("header meta: %+v", rec.Header.Object)
			}
		})
	}
}

func TestEventRoundTrip(t *testing.T) {
	cur := &store.Object{Key: "ns/a", Namespace: "ns", Name: "a", RV: 20, Labels: map[string]string{"app": "new"}, Fields: map[string]string{"f": "1"}, Raw: []byte(`{"v":2}`)}
	prev := &store.Object{Key: "ns/a", Namespace: "ns", Name: "a", RV: 10, Labels: map[string]string{"app": "old"}, Raw: invalidUTF8}
	cases := []struct {
		name      string
		typ       string
		rv        uint64
		obj, prev *store.Object
	}{
		{"added without prev", "ADDED", 20, cur, nil},
		{"modified with prev", "MODIFIED", 20, cur, prev},
		// A deletion's RV is the event's; the object keeps its own.
		{"deleted with prev", "DELETED", 30, cur, prev},
		{"prev with empty raw", "MODIFIED", 21, cur, testObj("ns/a", 1, nil)},
		{"empty object raw", "ADDED", 22, testObj("ns/z", 22, nil), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := decodeOne(t, encode(t, func(w *Writer) error { return w.Event(c.typ, c.rv, c.obj, c.prev) }))
			if rec.Kind != KindEvent || rec.Header.Type != c.typ || rec.Header.RV != c.rv {
				t.Fatalf("got kind %q type %q rv %d", rec.Kind, rec.Header.Type, rec.Header.RV)
			}
			if !sameObject(rec.Object, c.obj) {
				t.Fatalf("object: got %s want %s", describe(rec.Object), describe(c.obj))
			}
			if !sameObject(rec.Prev, c.prev) {
				t.Fatalf("prev: got %s want %s", describe(rec.Prev), describe(c.prev))
			}
		})
	}
}

func TestEndRoundTrip(t *testing.T) {
	zero, n := int64(0), int64(12345)
	cases := map[string]Header{
		"complete":          {RV: 100},
		"continue":          {RV: 100, Continue: "ns/k\x00after", Remaining: &n, LastKey: "ns/zzz"},
		"zero remaining":    {RV: 5, Continue: "ns/a", Remaining: &zero},
		"last key only":     {RV: 5, LastKey: "ns/é"},
		"nothing (rv zero)": {},
		"unicode continue":  {RV: 1, Continue: "ns/\u2028\u00e9"},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			rec := decodeOne(t, encode(t, func(w *Writer) error { return w.End(h) }))
			if rec.Kind != KindEnd || rec.Object != nil || rec.Prev != nil {
				t.Fatalf("got %+v", rec)
			}
			got := rec.Header
			if got.RV != h.RV || got.Continue != h.Continue || got.LastKey != h.LastKey {
				t.Fatalf("got %+v want %+v", got, h)
			}
			switch {
			case h.Remaining == nil && got.Remaining != nil:
				t.Fatalf("remaining: got %d want none", *got.Remaining)
			case h.Remaining != nil && (got.Remaining == nil || *got.Remaining != *h.Remaining):
				t.Fatalf("remaining: got %v want %d", got.Remaining, *h.Remaining)
			}
		})
	}
}

func TestWatermarkRoundTrip(t *testing.T) {
	for _, c := range []struct {
		rv       uint64
		uncached bool
	}{{0, false}, {1, false}, {42, true}, {^uint64(0), true}} {
		rec := decodeOne(t, encode(t, func(w *Writer) error { return w.Watermark(c.rv, c.uncached) }))
		if rec.Kind != KindWatermark || rec.Header.RV != c.rv || rec.Header.Uncached != c.uncached || rec.Object != nil {
			t.Fatalf("watermark %d/%v: got %+v", c.rv, c.uncached, rec)
		}
	}
}

// A watermark with sizes carries the shard's CPU per seat's worth of
// work; a writer counts the list items it wrote and their bytes, from
// zero again once pooled.
func TestWatermarkWithSizesAndWritten(t *testing.T) {
	sizes := store.Sizes{Objects: 3, Bytes: 300, Namespaces: 1, Values: map[string]int{"spec.nodeName": 2}}
	rec := decodeOne(t, encode(t, func(w *Writer) error { return w.WatermarkWithSizes(7, false, sizes, 250*time.Microsecond) }))
	if rec.Kind != KindWatermark || rec.Header.RV != 7 || rec.Header.Sizes == nil || rec.Header.Sizes.Bytes != 300 || rec.Header.SeatCPU != int64(250*time.Microsecond) {
		t.Fatalf("got %+v", rec.Header)
	}
	p := NewPools()
	var buf bytes.Buffer
	w := p.Writer(&buf)
	for _, o := range []*store.Object{{Key: "a", Name: "a", RV: 1, Raw: []byte(`{"a":1}`)}, {Key: "b", Name: "b", RV: 2, Raw: []byte(`{"bb":22}`)}} {
		if err := w.Item(o); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Watermark(3, false); err != nil {
		t.Fatal(err)
	}
	if items, n := w.Written(); items != 2 || n != 16 {
		t.Fatalf("written: %d items, %d bytes; want 2, 16", items, n)
	}
	p.PutWriter(w)
	if w = p.Writer(&buf); func() bool { items, n := w.Written(); return items != 0 || n != 0 }() {
		t.Fatal("a pooled writer kept its counts")
	}
}

// errorRoundTrip sends err as an error record and returns what the reader
// makes of it.
func errorRoundTrip(t *testing.T, err error) error {
	t.Helper()
	rec := decodeOne(t, encode(t, func(w *Writer) error { return w.Error(err) }))
	if rec.Kind != KindError || rec.Header.Error == nil {
		t.Fatalf("got %+v", rec)
	}
	got := rec.Header.Error.Err()
	if got == nil {
		t.Fatal("Err() is nil")
	}
	return got
}

func TestErrorRoundTrip(t *testing.T) {
	t.Run("expired", func(t *testing.T) {
		for _, err := range []error{
			&store.ExpiredError{RV: 5, Oldest: 9},
			fmt.Errorf("listing: %w", &store.ExpiredError{RV: 5, Oldest: 9}),
		} {
			got := errorRoundTrip(t, err)
			var e *store.ExpiredError
			if !errors.As(got, &e) || e.RV != 5 || e.Oldest != 9 {
				t.Fatalf("%v: got %T %v", err, got, got)
			}
			if !apierrors.IsResourceExpired(got) || apierrors.ReasonForError(got) != metav1.StatusReasonExpired {
				t.Fatalf("not a 410 Expired: %v", got)
			}
		}
	})
	t.Run("too large", func(t *testing.T) {
		orig := &store.TooLargeResourceVersionError{RV: 200, Current: 150, Err: context.DeadlineExceeded}
		got := errorRoundTrip(t, orig)
		var e *store.TooLargeResourceVersionError
		if !errors.As(got, &e) || e.RV != 200 || e.Current != 150 {
			t.Fatalf("got %T %v", got, got)
		}
		if e.Err != nil {
			t.Fatalf("the context error crossed the wire: %v", e.Err)
		}
		if got.Error() != orig.Error() || !apierrors.IsTimeout(got) {
			t.Fatalf("got %q (timeout %v), want %q", got.Error(), apierrors.IsTimeout(got), orig.Error())
		}
		st := e.Status()
		if st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge || st.Details.RetryAfterSeconds != 1 {
			t.Fatalf("status details: %+v", st.Details)
		}
	})
	t.Run("api status", func(t *testing.T) {
		got := errorRoundTrip(t, apierrors.NewBadRequest("bad selector \u00e9"))
		if !apierrors.IsBadRequest(got) || got.Error() != "bad selector \u00e9" {
			t.Fatalf("got %T %v", got, got)
		}
		var st apierrors.APIStatus
		if !errors.As(got, &st) || st.Status().Code != http.StatusBadRequest || st.Status().Status != metav1.StatusFailure {
			t.Fatalf("status: %+v", st)
		}

		// Details survive.
		nf := apierrors.NewNotFound(schema.GroupResource{Group: "apps", Resource: "deployments"}, "web")
		got = errorRoundTrip(t, nf)
		if !apierrors.IsNotFound(got) || got.Error() != nf.Error() {
			t.Fatalf("got %v", got)
		}
		if !errors.As(got, &st) || st.Status().Details == nil || st.Status().Details.Name != "web" || st.Status().Details.Group != "apps" || st.Status().Details.Kind != "deployments" {
			t.Fatalf("details: %+v", st.Status().Details)
		}

		// A wrapped status is still found.
		got = errorRoundTrip(t, fmt.Errorf("context: %w", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("no"))))
		if !apierrors.IsForbidden(got) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("plain error", func(t *testing.T) {
		got := errorRoundTrip(t, errors.New("disk on fire"))
		if !apierrors.IsInternalError(got) || got.Error() != "disk on fire" {
			t.Fatalf("got %T %v (reason %q)", got, got, apierrors.ReasonForError(got))
		}
		var st apierrors.APIStatus
		if !errors.As(got, &st) || st.Status().Code != http.StatusInternalServerError || st.Status().Status != metav1.StatusFailure {
			t.Fatalf("status: %+v", st)
		}
	})
	t.Run("empty error", func(t *testing.T) {
		if err := (&Error{}).Err(); err == nil {
			t.Fatal("an empty wire error must still be an error")
		}
	})
}

// A stream of several records decodes in order, and the Reader reuses
// nothing between records (a record stays valid after the next Next).
func TestStream(t *testing.T) {
	a := &store.Object{Key: "ns/a", Namespace: "ns", Name: "a", RV: 1, Labels: map[string]string{"x": "1"}, Raw: []byte(`{"a":1}`)}
	b := testObj("ns/b", 2, invalidUTF8)
	n := int64(3)
	data := encode(t, func(w *Writer) error {
		return errors.Join(w.Object(a), w.Object(b), w.End(Header{RV: 9, Continue: "ns/b", Remaining: &n, LastKey: "ns/z"}),
			w.Event("MODIFIED", 10, b, a), w.Watermark(11, true), w.Error(errors.New("bye")))
	})
	r := NewReader(bytes.NewReader(data))
	var recs []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	kinds := ""
	for _, rec := range recs {
		kinds += string(rec.Kind)
	}
	if kinds != "OOTEWX" {
		t.Fatalf("kinds %q", kinds)
	}
	if !sameObject(recs[0].Object, a) || !sameObject(recs[1].Object, b) || !sameObject(recs[3].Object, b) || !sameObject(recs[3].Prev, a) {
		t.Fatal("objects changed after later records were read")
	}
	if recs[5].Header.Error.Err().Error() != "bye" {
		t.Fatal(recs[5].Header.Error.Err())
	}
}

// --- malformed input ------------------------------------------------------

// sampleStream is a valid stream of every kind of record and where each
// record ends.
func sampleStream(t testing.TB) (data []byte, ends []int) {
	t.Helper()
	n := int64(2)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	obj := &store.Object{Key: "ns/a", Namespace: "ns", Name: "a", RV: 5, Labels: map[string]string{"l": "v"}, Fields: map[string]string{"f": "v"}, Raw: invalidUTF8}
	prev := testObj("ns/a", 4, []byte(`{"prev":true}`))
	steps := []func() error{
		func() error { return w.Object(obj) },
		func() error { return w.Object(testObj("ns/empty", 6, nil)) },
		func() error { return w.End(Header{RV: 7, Continue: "ns/a", Remaining: &n, LastKey: "ns/q"}) },
		func() error { return w.Event("MODIFIED", 8, obj, prev) },
		func() error { return w.Event("ADDED", 9, obj, nil) },
		// An event whose previous state has no bytes: its prev chunk is
		// empty, which the truncation test must still tell from a
		// missing one.
		func() error { return w.Event("DELETED", 10, obj, testObj("ns/a", 4, nil)) },
		func() error { return w.Watermark(11, true) },
		func() error { return w.Error(&store.ExpiredError{RV: 1, Oldest: 2}) },
		func() error { return w.Error(apierrors.NewBadRequest("no")) },
		// Items with their content hashes, as a front that asks gets
		// them; one without a hash is a plain object record still.
		func() error {
			w.SendContentHashes()
			o := testObj("ns/h", 12, []byte(`{"h":1}`))
			o.ContentHash = store.HashContent(o.Raw)
			return w.Item(o)
		},
		func() error { return w.Item(testObj("ns/i", 13, []byte(`{}`))) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, buf.Len())
	}
	return buf.Bytes(), ends
}

// readAll reads until the first error and returns the records and it.
func readAll(data []byte) ([]Record, error) {
	r := NewReader(bytes.NewReader(data))
	var recs []Record
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, err
		}
		recs = append(recs, rec)
	}
}

// Cutting a stream anywhere gives the whole records before the cut and
// then an error: io.EOF exactly when the cut is at a record boundary,
// io.ErrUnexpectedEOF otherwise. Never a panic, never a partial record.
func TestTruncatedEverywhere(t *testing.T) {
	data, ends := sampleStream(t)
	boundary := map[int]int{0: 0} // offset → records before it
	for i, e := range ends {
		boundary[e] = i + 1
	}
	complete := 0
	for cut := 0; cut <= len(data); cut++ {
		if n, ok := boundary[cut]; ok {
			complete = n
		}
		recs, err := readAll(data[:cut])
		if len(recs) != complete {
			t.Fatalf("cut at %d/%d: %d records, want %d (err %v)", cut, len(data), len(recs), complete, err)
		}
		if _, atBoundary := boundary[cut]; atBoundary {
			if err != io.EOF {
				t.Fatalf("cut at record boundary %d: want io.EOF, got %v", cut, err)
			}
		} else if err != io.ErrUnexpectedEOF {
			t.Fatalf("cut inside a record at %d: want io.ErrUnexpectedEOF, got %v", cut, err)
		}
	}
}

// The same for a record with a large raw part, at a few offsets inside it.
func TestTruncatedLargeRecord(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	data := encode(t, func(w *Writer) error {
		return w.Event("ADDED", 2, testObj("ns/big", 2, big), testObj("ns/big", 1, big[:1000]))
	})
	for _, cut := range []int{1, 2, 30, len(data) / 2, len(data) - 1001, len(data) - 1000, len(data) - 1} {
		recs, err := readAll(data[:cut])
		if len(recs) != 0 || err != io.ErrUnexpectedEOF {
			t.Fatalf("cut at %d/%d: %d records, err %v", cut, len(data), len(recs), err)
		}
	}
	if recs, err := readAll(data); len(recs) != 1 || err != io.EOF || !bytes.Equal(recs[0].Object.Raw, big) {
		t.Fatalf("whole: %d records, err %v", len(recs), err)
	}
}

func TestUnknownKind(t *testing.T) {
	valid := encode(t, func(w *Writer) error { return w.Watermark(1, false) })
	for _, k := range []byte{0, 'o', 'A', 'Z', 0xff, '{'} {
		data := append([]byte{k}, valid[1:]...)
		_, err := NewReader(bytes.NewReader(data)).Next()
		if err == nil || err == io.EOF || !strings.Contains(err.Error(), "unknown record kind") {
			t.Fatalf("kind %q: got %v", k, err)
		}
	}
	// After a valid record too.
	data := append(append([]byte{}, valid...), 'Q', 0, 0)
	recs, err := readAll(data)
	if len(recs) != 1 || err == nil || err == io.EOF {
		t.Fatalf("%d records, %v", len(recs), err)
	}
}

func TestMalformedRecords(t *testing.T) {
	rec := func(k Kind, hdr string, chunks ...[]byte) []byte {
		b := []byte{byte(k)}
		b = binary.AppendUvarint(b, uint64(len(hdr)))
		b = append(b, hdr...)
		for _, c := range chunks {
			b = binary.AppendUvarint(b, uint64(len(c)))
			b = append(b, c...)
		}
		return b
	}
	cases := map[string]struct {
		data []byte
		want string
	}{
		"header not JSON":              {rec(KindWatermark, `{"rv":`, nil), "record header"},
		"header wrong type":            {rec(KindWatermark, `{"rv":"x"}`, nil), "record header"},
		"object truncated in metadata": {[]byte{byte(KindObject), 1, 'a', 0}, io.ErrUnexpectedEOF.Error()},
		"event truncated in metadata":  {append(binaryEventHead(), 1, 'a'), io.ErrUnexpectedEOF.Error()},
		"event bad prev flag":          {append(append(binaryEventHead(), binaryMeta()...), 1, 'x', 7), "previous-state flag"},
		"metadata in a watermark":      {rec(KindWatermark, `{"rv":1,"o":{"k":"a","n":"a","rv":1}}`, nil), "carries none"},
		"payload in a watermark":       {rec(KindWatermark, `{"rv":1}`, []byte("x")), "carries none"},
		"too many labels":              {append(append([]byte{byte(KindObject)}, binaryMetaHead()...), binary.AppendUvarint(nil, maxPairs+1)...), "exceed the limit"},
		"error without error":          {rec(KindError, `{"rv":1}`, nil), "without error"},
		"varint overflow (header)":     {append([]byte{'W'}, bytes.Repeat([]byte{0xff}, 11)...), "overflow"},
		"varint overflow (raw)":        {append(rec(KindWatermark, `{}`)[:4], bytes.Repeat([]byte{0xff}, 11)...), "overflow"},
		"event missing prev flag":      {append(append(binaryEventHead(), binaryMeta()...), 1, 'x'), io.ErrUnexpectedEOF.Error()},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			recs, err := readAll(c.data)
			if len(recs) != 0 || err == nil || err == io.EOF || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%d records, err %v; want an error containing %q", len(recs), err, c.want)
			}
		})
	}
}

// binaryMetaHead is an object's metadata up to its labels: key "a",
// namespace "", name "a", RV 1.
func binaryMetaHead() []byte { return []byte{1, 'a', 0, 1, 'a', 1} }

// binaryMeta is binaryMetaHead with no labels and no fields.
func binaryMeta() []byte { return append(binaryMetaHead(), 0, 0) }

// binaryEventHead is an ADDED event at RV 1 up to its metadata.
func binaryEventHead() []byte { return []byte{byte(KindEvent), 5, 'A', 'D', 'D', 'E', 'D', 1} }

// allocated is how many bytes the process allocated while fn ran.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A length prefix above the limits is refused before anything of that size
// is allocated.
func TestOversizedPrefixRefused(t *testing.T) {
	obj := append([]byte{byte(KindObject)}, binaryMeta()...)
	event := append(binaryEventHead(), binaryMeta()...)
	withPrev := append(append(append([]byte{}, event...), 1, 'x', 1), binaryMeta()...)
	cases := map[string][]byte{
		"header":     binary.AppendUvarint([]byte{byte(KindWatermark)}, maxHeader+1),
		"header max": binary.AppendUvarint([]byte{byte(KindWatermark)}, 1<<63),
		"key":        binary.AppendUvarint([]byte{byte(KindObject)}, maxHeader+1),
		"raw":        binary.AppendUvarint(obj, maxRaw+1),
		"raw max":    binary.AppendUvarint(event, ^uint64(0)),
		"prev":       binary.AppendUvarint(withPrev, maxRaw+1),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			// Followed by plenty of bytes, so only the limit can refuse it.
			data := append(append([]byte{}, data...), make([]byte, 1024)...)
			r := NewReader(bytes.NewReader(data))
			var err error
			n := allocated(func() { _, err = r.Next() })
			if err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
				t.Fatalf("want a limit error, got %v", err)
			}
			if n > 256<<10 {
				t.Fatalf("refusing the record allocated %d bytes", n)
			}
		})
	}
	// At the limit is allowed (the header limit is cheap to check).
	data := binary.AppendUvarint([]byte{byte(KindWatermark)}, maxHeader)
	if _, err := NewReader(bytes.NewReader(data)).Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("header of exactly the limit, truncated: %v", err)
	}
}

// The package promises that "a corrupt or hostile stream is an error,
// never a huge allocation", but a prefix within the limit is allocated in
// full before a single byte of it is read: a 10-byte stream makes the
// reader allocate 64 MiB.
func TestTruncatedPrefixDoesNotAllocateItsLength(t *testing.T) {
	data := binary.AppendUvarint(append([]byte{byte(KindObject)}, binaryMeta()...), maxRaw)
	r := NewReader(bytes.NewReader(data))
	var err error
	n := allocated(func() { _, err = r.Next() })
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("want io.ErrUnexpectedEOF, got %v", err)
	}
	if n > 1<<20 {
		t.Fatalf("a %d-byte stream allocated %d bytes", len(data), n)
	}
}

// --- fuzzing --------------------------------------------------------------

// canonical is what a record means, for comparing a decoded record with
// its re-encoding: only what the Writer writes for the kind, with nil and
// empty alike and an error by the error value it stands for.
func canonical(t *testing.T, rec Record) string {
	t.Helper()
	type obj struct {
		Key, Namespace, Name string
		RV                   uint64
		Labels, Fields       map[string]string
		Raw                  []byte
		ContentHash          uint64
	}
	conv := func(o *store.Object) *obj {
		if o == nil {
			return nil
		}
		r := &obj{Key: o.Key, Namespace: o.Namespace, Name: o.Name, RV: o.RV, Raw: o.Raw, ContentHash: o.ContentHash}
		if len(o.Labels) > 0 {
			r.Labels = o.Labels
		}
		if len(o.Fields) > 0 {
			r.Fields = o.Fields
		}
		if len(r.Raw) == 0 {
			r.Raw = nil
		}
		return r
	}
	var v any
	switch rec.Kind {
	case KindObject:
		v = conv(rec.Object)
	case KindEvent:
		v = []any{rec.Header.Type, rec.Header.RV, conv(rec.Object), conv(rec.Prev)}
	case KindEnd:
		v = rec.Header
	case KindWatermark:
		v = []any{rec.Header.RV, rec.Header.Uncached}
	case KindError:
		v = NewError(rec.Header.Error.Err())
	default:
		t.Fatalf("decoded a record of unknown kind %q", rec.Kind)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %+v: %v", v, err)
	}
	return string(rec.Kind) + string(b)
}

// reencode writes rec with the Writer (content hashes asked for: an object
// read with one is written with it).
func reencode(t *testing.T, rec Record) []byte {
	return encode(t, func(w *Writer) error {
		w.SendContentHashes()
		switch rec.Kind {
		case KindObject:
			return w.Object(rec.Object)
		case KindEvent:
			return w.Event(rec.Header.Type, rec.Header.RV, rec.Object, rec.Prev)
		case KindEnd:
			return w.End(rec.Header)
		case KindWatermark:
			return w.Watermark(rec.Header.RV, rec.Header.Uncached)
		case KindError:
			return w.Error(rec.Header.Error.Err())
		}
		return fmt.Errorf("kind %q", rec.Kind)
	})
}

func FuzzReader(f *testing.F) {
	data, ends := sampleStream(f)
	f.Add(data)
	start := 0
	for _, e := range ends {
		f.Add(data[start:e]) // each record alone
		start = e
	}
	f.Add(data[:len(data)/2])
	f.Add([]byte{})
	f.Add([]byte("E"))
	f.Add([]byte(`X` + "\x0a" + `{"e":{}}` + "\x00"))
	f.Add([]byte(`T` + "\x1b" + `{"o":{"l":{}},"r":0,"c":""}` + "\x00"))
	f.Add([]byte("O\x10{\"o\":{\"k\":\"\xff\"}}\x01\xff"))
	f.Add([]byte("H\x01\x02\x03\x04\x05\x06\x07\x08\x01a\x00\x01a\x01\x00\x00\x02{}"))
	f.Add([]byte("H\x01\x02\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		for i := 0; ; i++ {
			rec, err := r.Next()
			if err != nil {
				if rec.Kind != 0 || rec.Object != nil || rec.Prev != nil {
					t.Fatalf("record %d: a partial record with error %v", i, err)
				}
				return
			}
			want := canonical(t, rec)
			again := decodeOne(t, reencode(t, rec))
			if got := canonical(t, again); got != want {
				t.Fatalf("record %d changed in a round trip:\n got  %s\n want %s", i, got, want)
			}
		}
	})
}

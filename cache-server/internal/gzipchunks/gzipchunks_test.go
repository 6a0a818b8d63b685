package gzipchunks

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

func TestCRCCombine(t *testing.T) {
	x2n := newX2nTable()
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 3, 7, 64, 1000, 65536, 1 << 20} {
		a := make([]byte, r.IntN(5000))
		b := make([]byte, n)
		for i := range a {
			a[i] = byte(r.Uint32())
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		want := crc32.ChecksumIEEE(append(append([]byte{}, a...), b...))
		if got := crcCombine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), x2n.shiftOp(int64(n))); got != want {
			t.Errorf("len(a)=%d len(b)=%d: combined %08x, want %08x", len(a), n, got, want)
		}
	}
}

func newMetrics() Metrics {
	return Metrics{
		Chunks:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "chunks"}, []string{"resource", "result"}),
		Bytes:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "bytes"}),
		Evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "evictions"}),
	}
}

// object is a stored object of about size bytes; fill picks its payload
// (compressible or not).
func object(name string, rv uint64, size int, fill func([]byte)) *store.Object {
	payload := make([]byte, size)
	fill(payload)
	raw := fmt.Appendf(nil, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"ns","resourceVersion":"%d"},"data":{"p":%q}}`, name, rv, payload)
	return &store.Object{Key: "ns/" + name, Namespace: "ns", Name: name, RV: rv, Raw: raw}
}

func xs(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

func newStore(t testing.TB, n, size int, fill func([]byte)) (*store.Store, uint64) {
	t.Helper()
	st, err := store.New(store.Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	objs := make([]*store.Object, n)
	for i := range objs {
		objs[i] = object(fmt.Sprintf("cm-%06d", i), 1, size, fill)
	}
	if _, err := st.Replace(objs, 1); err != nil {
		t.Fatal(err)
	}
	return st, 1
}

func listItems(t testing.TB, st *store.Store, req store.ListRequest) []*store.Object {
	t.Helper()
	res, err := st.List(req)
	if err != nil {
		t.Fatal(err)
	}
	return res.Items
}

func writeItem(dst ItemWriter, o *store.Object) { _, _ = dst.Write(o.Raw) }

// plain is the uncompressed body Writer must produce.
func plain(head string, items []*store.Object, tail string) []byte {
	var b bytes.Buffer
	b.WriteString(head)
	for i, o := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(o.Raw)
	}
	b.WriteString(tail)
	return b.Bytes()
}

// body writes a gzip body of items through s and returns it.
func body(t testing.TB, s *Scope, head string, items []*store.Object, tail string) []byte {
	t.Helper()
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	w := s.NewWriter(bw)
	_, _ = w.Write([]byte(head))
	w.Items(items, writeItem)
	_, _ = w.Write([]byte(tail))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_ = bw.Flush()
	return out.Bytes()
}

// checkBody writes a body of items through s and fails unless it
// decompresses to the plain body; format and args say which body.
func checkBody(t testing.TB, s *Scope, head string, items []*store.Object, tail string, format string, args ...any) {
	t.Helper()
	if got, want := gunzip(t, body(t, s, head, items, tail)), plain(head, items, tail); !bytes.Equal(got, want) {
		t.Fatalf("%s: decompresses to %d bytes that differ from the %d of the plain body", fmt.Sprintf(format, args...), len(got), len(want))
	}
}

// gunzip decompresses with the standard library, as client-go's transport
// does, and fails on a bad stream or checksum.
func gunzip(t testing.TB, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	got, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("gunzip: %v", err)
	}
	if rest, _ := io.ReadAll(zr); len(rest) != 0 {
		t.Fatalf("%d bytes after the gzip member", len(rest))
	}
	return got
}

func TestBodiesFromCachedChunks(t *testing.T) {
	m := newMetrics()
	c := New(0, m)
	s := c.Scope("configmaps")
	st, rv := newStore(t, 3000, 1024, xs)
	all := listItems(t, st, store.ListRequest{})
	head, tail := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[`, `]}`

	first := body(t, s, head, all, tail)
	if got, want := gunzip(t, first), plain(head, all, tail); !bytes.Equal(got, want) {
		t.Fatalf("cold body decompresses to %d bytes, want the %d of the plain body", len(got), len(want))
	}
	misses := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "miss"))
	if misses < 20 || cacheLen(c) != int(misses) {
		t.Fatalf("cold body: %v misses, %d entries; want ~3000/%d chunks, all kept", misses, cacheLen(c), chunkItems)
	}

	// The same objects again: every chunk from the cache, the same bytes.
	second := body(t, s, head, all, tail)
	if !bytes.Equal(first, second) {
		t.Fatalf("warm body differs from the cold one")
	}
	if hits := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "hit")); hits != misses {
		t.Fatalf("warm body: %v hits, want %v", hits, misses)
	}

	// Change, add and delete objects: only their chunks are compressed
	// again, and the body is the new plain one.
	for i, name := range []string{"cm-000100", "cm-001500", "cm-002999"} {
		rv++
		if err := st.Apply(store.Event{Type: store.Modified, Object: object(name, rv, 900+i, xs), RV: rv}); err != nil {
			t.Fatal(err)
		}
	}
	rv++
	if err := st.Apply(store.Event{Type: store.Added, Object: object("cm-000500a", rv, 10, xs), RV: rv}); err != nil {
		t.Fatal(err)
	}
	rv++
	if err := st.Apply(store.Event{Type: store.Deleted, Object: all[2000], RV: rv}); err != nil {
		t.Fatal(err)
	}
	all = listItems(t, st, store.ListRequest{})
	before := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "miss"))
	checkBody(t, s, head, all, tail, "after changes")
	if again := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "miss")) - before; again < 1 || again > 10 {
		t.Fatalf("5 changes compressed %v chunks again, want a few", again)
	}

	// Other ranges (a page, a range starting mid-chunk) share chunks and
	// are right too.
	for _, req := range []store.ListRequest{{Limit: 500}, {StartKeyExclusive: "ns/cm-000777", Limit: 900}, {StartKeyExclusive: "ns/cm-002990"}} {
		items := listItems(t, st, req)
		for range 2 {
			checkBody(t, s, head, items, tail, "%+v", req)
		}
	}
	if cacheBytes(c) <= 0 || testutil.ToFloat64(m.Bytes) != float64(cacheBytes(c)) {
		t.Fatalf("cache bytes %d, gauge %v", cacheBytes(c), testutil.ToFloat64(m.Bytes))
	}
}

func TestEmptyAndUnnumbered(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("r")
	if got := gunzip(t, body(t, s, `{"items":[`, nil, `]}`)); string(got) != `{"items":[]}` {
		t.Fatalf("empty list: %q", got)
	}
	// Objects that never went through a Store have no Seq: written, not
	// kept.
	items := []*store.Object{object("a", 1, 100, xs), object("b", 1, 100, xs)}
	for range 2 {
		checkBody(t, s, `[`, items, `]`, "objects without Seq")
	}
	if cacheLen(c) != 0 {
		t.Fatalf("%d entries for objects without Seq", cacheLen(c))
	}
}

func TestIncompressibleChunksAreNotKept(t *testing.T) {
	c := New(0, newMetrics())
	r := rand.New(rand.NewPCG(3, 4))
	st, _ := newStore(t, 300, 2048, func(b []byte) {
		for i := range b {
			b[i] = 'a' + byte(r.IntN(26))
		}
	})
	// Random letters compress to ~5/8: below the bound of 1/2, so not kept.
	items := listItems(t, st, store.ListRequest{})
	if got, want := gunzip(t, body(t, c.Scope("r"), `[`, items, `]`)), plain(`[`, items, `]`); !bytes.Equal(got, want) {
		t.Fatal("body differs from the plain one")
	}
	if cacheLen(c) != 0 {
		t.Fatalf("%d incompressible chunks kept", cacheLen(c))
	}
}

func TestBudgetEvictsLeastRecentlyUsed(t *testing.T) {
	m := newMetrics()
	c := New(64<<10, m)
	s := c.Scope("r")
	st, _ := newStore(t, 4000, 1024, xs)
	items := listItems(t, st, store.ListRequest{})
	for range 3 {
		checkBody(t, s, `[`, items, `]`, "body")
		if cacheBytes(c) > 64<<10 {
			t.Fatalf("cache holds %d bytes, budget %d", cacheBytes(c), 64<<10)
		}
	}
	if testutil.ToFloat64(m.Evictions) == 0 {
		t.Fatal("no evictions with a budget smaller than the list")
	}
}

// A client that goes away mid-body: Close reports it, and no chunk cut
// short is kept for the next body.
func TestWriteErrorKeepsNothingBroken(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("r")
	st, _ := newStore(t, 2000, 1024, xs)
	items := listItems(t, st, store.ListRequest{})
	gone := errors.New("client gone")
	w := s.NewWriter(&failAfter{n: 5000, err: gone})
	_, _ = w.Write([]byte(`[`))
	w.Items(items, writeItem)
	_, _ = w.Write([]byte(`]`))
	if err := w.Close(); !errors.Is(err, gone) {
		t.Fatalf("Close = %v, want the write error", err)
	}
	checkBody(t, s, `[`, items, `]`, "the body after a failed one")
}

type failAfter struct {
	n   int
	err error
}

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, f.err
	}
	f.n -= len(p)
	return len(p), nil
}

// FuzzBodies drives a store through changes and reads of ranges from the
// fuzzer's bytes; every body must decompress to its plain form.
func FuzzBodies(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 17, 99, 4})
	f.Add(bytes.Repeat([]byte{7, 250}, 40))
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := New(32<<10, newMetrics())
		s := c.Scope("r")
		// The same ranges handed over one at a time (a fleet's front):
		// chunks by content, some items held before the stream.
		byContent := c.Scope("r")
		st, rv := newStore(t, 400, 200, xs)
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], int(ops[i+1])
			name := fmt.Sprintf("cm-%06d", arg*2)
			rv++
			switch op % 4 {
			case 0: // modify or add
				typ := store.Added
				if arg*2 < 400 {
					typ = store.Modified
				}
				if err := st.Apply(store.Event{Type: typ, Object: object(name, rv, arg, xs), RV: rv}); err != nil {
					t.Skip(err) // an add of a key that exists: not what is tested
				}
			case 1: // delete
				if o, _, _ := st.Get("ns/"+name, 0); o != nil {
					if err := st.Apply(store.Event{Type: store.Deleted, Object: o, RV: rv}); err != nil {
						t.Fatal(err)
					}
				}
			default: // read a range
				items := listItems(t, st, store.ListRequest{StartKeyExclusive: fmt.Sprintf("ns/cm-%06d", arg), Limit: int64(op)})
				checkBody(t, s, `[`, items, `]`, "op %d", i/2)
				checkStream(t, byContent, `[`, unnumbered(items), min(int(op)%5, len(items)), `]`)
			}
		}
	})
}

// Every kept run must decode on its own (no back-reference into bytes
// before it: another body has other bytes there) to exactly the chunk it
// stands for — here the chunks are of objects that differ from one another,
// and the chunks' neighbours change between the bodies.
func TestRunsDecodeAlone(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("r")
	r := rand.New(rand.NewPCG(5, 6))
	words := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
	st, rv := newStore(t, 2000, 300, func(b []byte) {
		for i := 0; i < len(b); {
			i += copy(b[i:], words[r.IntN(len(words))])
		}
	})
	items := listItems(t, st, store.ListRequest{})
	// A head over 128 bytes (the compressor resets itself after flushing
	// less) that the first item could refer back to.
	head := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJjbS0wMDAwMDBcdTAwMDAifQ"},"items":[{"kind":"ConfigMap","apiVersion":"v1",`
	_ = body(t, s, head, items, `]`)
	// Change every 50th object, so most chunks' neighbours changed.
	for i := 0; i < len(items); i += 50 {
		rv++
		if err := st.Apply(store.Event{Type: store.Modified, Object: object(items[i].Name, rv, 17, xs), RV: rv}); err != nil {
			t.Fatal(err)
		}
	}
	items = listItems(t, st, store.ListRequest{})
	checkBody(t, s, head, items, `]`, "after changes")
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		// A final empty stored block after the run's sync flush.
		run := append(bytes.Clone(e.run), 1, 0, 0, 0xff, 0xff)
		got, err := io.ReadAll(flateReader(run))
		if err != nil {
			t.Fatalf("run of %d objects from Seq %d does not decode alone: %v", e.key.n, e.key.first, err)
		}
		if int64(len(got)) != e.size || crc32.ChecksumIEEE(got) != e.crc {
			t.Fatalf("run of %d objects from Seq %d decodes to %d bytes (crc %08x), kept as %d (crc %08x)", e.key.n, e.key.first, len(got), crc32.ChecksumIEEE(got), e.size, e.crc)
		}
	}
}

// Fresh bytes after a cached run must not refer back to what the
// compressor saw before it: a tail that repeats a long head is where it
// would (the compressor forgets on its own what it flushed under 128
// bytes).
func TestFreshBytesAfterRuns(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("r")
	st, _ := newStore(t, 500, 1024, xs)
	items := listItems(t, st, store.ListRequest{})
	end, _ := chunkEnd(items, 0)
	items = items[:end] // one chunk: the tail follows the run
	head := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"12345678","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJjbS0wMDAwMDBcdTAwMDAifQ"},"items":[`
	tail := `],"tail":` + head + `]}`
	for range 2 {
		checkBody(t, s, head, items, tail, "body")
	}
}

func flateReader(b []byte) io.Reader { return flate.NewReader(bytes.NewReader(b)) }

// Readers list ranges while a writer changes objects, within a budget
// that evicts: every body is its plain form (run with -race).
func TestConcurrentReadersAndChanges(t *testing.T) {
	c := New(256<<10, newMetrics())
	s := c.Scope("r")
	st, rv := newStore(t, 3000, 700, xs)
	done := make(chan struct{})
	errs := make(chan error, 4)
	for r := range 4 {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				req := store.ListRequest{StartKeyExclusive: fmt.Sprintf("ns/cm-%06d", (i*337+r*911)%3000), Limit: int64(200 + r*300)}
				res, err := st.List(req)
				if err != nil {
					errs <- err
					return
				}
				var out bytes.Buffer
				w := s.NewWriter(&out)
				_, _ = w.Write([]byte(`[`))
				w.Items(res.Items, writeItem)
				_, _ = w.Write([]byte(`]`))
				if err := w.Close(); err != nil {
					errs <- err
					return
				}
				zr, err := gzip.NewReader(&out)
				if err != nil {
					errs <- err
					return
				}
				got, err := io.ReadAll(zr)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, plain(`[`, res.Items, `]`)) {
					errs <- fmt.Errorf("reader %d, %+v: body differs from the plain one", r, req)
					return
				}
			}
		}()
	}
	for i := range 400 {
		rv++
		if err := st.Apply(store.Event{Type: store.Modified, Object: object(fmt.Sprintf("cm-%06d", (i*7919)%3000), rv, 500+i%300, xs), RV: rv}); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if cacheBytes(c) > 256<<10 {
		t.Fatalf("cache holds %d bytes, budget %d", cacheBytes(c), 256<<10)
	}
}

// A client gone at any point, with chunks kept and not: Close reports it,
// what is left is not compressed for nobody, and the next body is right.
func TestClientGoneAnywhere(t *testing.T) {
	m := newMetrics()
	c := New(0, m)
	s := c.Scope("r")
	st, rv := newStore(t, 2000, 1024, xs)
	items := listItems(t, st, store.ListRequest{})
	chunks := 0
	for start := 0; start < len(items); chunks++ {
		start, _ = chunkEnd(items, start)
	}
	gone := errors.New("client gone")
	size := len(body(t, s, `[`, items, `]`))
	for _, at := range []int{1, 10, 100, size / 10, size / 4, size / 2, size * 3 / 4, size - 20} {
		// Half the chunks kept, half not.
		for i := 0; i < len(items); i += 120 {
			rv++
			if err := st.Apply(store.Event{Type: store.Modified, Object: object(items[i].Name, rv, 1000+at%7, xs), RV: rv}); err != nil {
				t.Fatal(err)
			}
		}
		items = listItems(t, st, store.ListRequest{})
		before := testutil.ToFloat64(m.Chunks.WithLabelValues("r", "miss")) + testutil.ToFloat64(m.Chunks.WithLabelValues("r", "hit"))
		w := s.NewWriter(&failAfter{n: at, err: gone})
		_, _ = w.Write([]byte(`[`))
		w.Items(items, writeItem)
		_, _ = w.Write([]byte(`]`))
		if err := w.Close(); !errors.Is(err, gone) {
			t.Fatalf("gone after %d bytes: Close = %v, want the write error", at, err)
		}
		if done := testutil.ToFloat64(m.Chunks.WithLabelValues("r", "miss")) + testutil.ToFloat64(m.Chunks.WithLabelValues("r", "hit")) - before; at <= size/2 && done >= float64(chunks) {
			t.Fatalf("gone after %d bytes: still wrote all %v chunks", at, done)
		}
		checkBody(t, s, `[`, items, `]`, "the body after one gone after %d bytes", at)
	}
}

// The same range at two states (a client paging through an older
// snapshot while objects change) keeps an entry for each instead of each
// evicting the other.
func TestTwoStatesOfARangeBothKept(t *testing.T) {
	m := newMetrics()
	c := New(0, m)
	s := c.Scope("r")
	numbered := func(seqs ...uint64) []*store.Object {
		var out []*store.Object
		for i, seq := range seqs {
			o := object(fmt.Sprintf("cm-%d", i), seq, 2000, xs)
			o.Seq = seq
			if boundary(seq) {
				t.Fatalf("Seq %d ends a chunk: pick another", seq)
			}
			out = append(out, o)
		}
		return out
	}
	older, newer := numbered(1, 2, 3), numbered(1, 2, 4)
	for _, items := range [][]*store.Object{older, newer, older, newer} {
		checkBody(t, s, `[`, items, `]`, "body")
	}
	if cacheLen(c) != 2 {
		t.Fatalf("%d entries, want one per state", cacheLen(c))
	}
	if hits := testutil.ToFloat64(m.Chunks.WithLabelValues("r", "hit")); hits != 2 {
		t.Fatalf("%v hits, want the second read of each state", hits)
	}
}

// cacheLen and cacheBytes are the cache's entries and accounted bytes.
func cacheLen(c *Cache) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

func cacheBytes(c *Cache) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// A stream scope (a watch-list's initial events) joins its items with
// nothing: each frame ends in its own newline. Its chunks are not a list
// scope's, although the objects are the same.
func TestStreamScopeFrames(t *testing.T) {
	m := newMetrics()
	c := New(0, m)
	list, stream := c.Scope("configmaps"), c.StreamScope("configmaps")
	st, _ := newStore(t, 1000, 512, xs)
	all := listItems(t, st, store.ListRequest{})
	frame := func(dst ItemWriter, o *store.Object) {
		_, _ = dst.Write([]byte(`{"type":"ADDED","object":`))
		_, _ = dst.Write(o.Raw)
		_, _ = dst.Write([]byte("}\n"))
	}
	var want bytes.Buffer
	for _, o := range all {
		fmt.Fprintf(&want, "{\"type\":\"ADDED\",\"object\":%s}\n", o.Raw)
	}
	write := func(s *Scope, item func(ItemWriter, *store.Object)) []byte {
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		w := s.NewWriter(bw)
		w.Items(all, item)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		_ = bw.Flush()
		return out.Bytes()
	}
	checkBody(t, list, "[", all, "]", "the list before the stream")
	listEntries := cacheLen(c)
	cold := write(stream, frame)
	if got := gunzip(t, cold); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("cold stream decompresses to %d bytes, want the %d of the frames", len(got), len(want.Bytes()))
	}
	if cacheLen(c) != 2*listEntries {
		t.Fatalf("%d entries after the list's %d and the stream's: want the stream's chunks kept beside the list's", cacheLen(c), listEntries)
	}
	hits := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "hit"))
	if warm := write(stream, frame); !bytes.Equal(warm, cold) {
		t.Fatal("warm stream differs from the cold one")
	}
	if got := testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "hit")) - hits; got != float64(listEntries) {
		t.Fatalf("warm stream: %v hits, want %d", got, listEntries)
	}
	checkBody(t, list, "[", all, "]", "the list after the stream")
}

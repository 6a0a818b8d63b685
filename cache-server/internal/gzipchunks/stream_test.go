package gzipchunks

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// streamBody writes a gzip body of items through s as a fleet's front
// does: the first held items written as fresh bytes, the rest handed over
// one at a time from a buffer that is overwritten after each call, each
// with its ContentHash (0 unless the test set it: the Stream hashes).
func streamBody(t testing.TB, s *Scope, head string, items []*store.Object, held int, tail string) []byte {
	t.Helper()
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	w := s.NewWriter(bw)
	fresh := []byte(head)
	for i, o := range items[:held] {
		if i > 0 {
			fresh = append(fresh, s.sep...)
		}
		fresh = append(fresh, o.Raw...)
	}
	_, _ = w.Write(fresh)
	st := w.Stream(writeItem, held > 0)
	scratch := make([]byte, 0, 4096)
	for _, o := range items[held:] {
		scratch = append(scratch[:0], o.Raw...)
		if err := st.Add(scratch, o.ContentHash); err != nil {
			t.Fatal(err)
		}
		for i := range scratch {
			scratch[i] = 'x' // the caller's buffer is reused: Add copied it
		}
	}
	_, _ = w.Write([]byte(tail))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_ = bw.Flush()
	return out.Bytes()
}

// Items handed over one at a time, keyed by content, give the plain body
// cold and warm, reuse every chunk of an unchanged list, compress again
// only the chunks of changed objects, and cut the same chunks whether the
// list starts with held items or not (content-defined boundaries).
func TestStreamByContent(t *testing.T) {
	m := newMetrics()
	c := New(0, m)
	s := c.Scope("configmaps")
	st, rv := newStore(t, 3000, 1024, xs)
	all := unnumbered(listItems(t, st, store.ListRequest{}))
	head, tail := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[`, `]}`
	misses := func() float64 { return testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "miss")) }
	hits := func() float64 { return testutil.ToFloat64(m.Chunks.WithLabelValues("configmaps", "hit")) }

	for _, held := range []int{0, 100} {
		cold := streamBody(t, s, head, all, held, tail)
		if got, want := gunzip(t, cold), plain(head, all, tail); !bytes.Equal(got, want) {
			t.Fatalf("held %d: cold body decompresses to %d bytes, want the %d of the plain body", held, len(got), len(want))
		}
		m0, h0 := misses(), hits()
		warm := streamBody(t, s, head, all, held, tail)
		if !bytes.Equal(warm, cold) {
			t.Fatalf("held %d: warm body differs from the cold one", held)
		}
		if misses() != m0 || hits()-h0 < 20 {
			t.Fatalf("held %d: warm body compressed %v chunks and took %v from the cache; want 0 and all", held, misses()-m0, hits()-h0)
		}
	}

	// Items whose shard sent their content hash: the same body and every
	// chunk from the cache (the hash Add would have computed, given).
	m0, h0 := misses(), hits()
	if warm := streamBody(t, s, head, hashed(all), 0, tail); !bytes.Equal(warm, streamBody(t, s, head, all, 0, tail)) {
		t.Fatal("items with their content hashes given: the body differs from the one hashed by the stream")
	}
	if misses() != m0 || hits()-h0 < 40 {
		t.Fatalf("items with their content hashes given: %v chunks compressed, %v from the cache; want 0 and all", misses()-m0, hits()-h0)
	}

	// Change two objects: only their chunks (and, with items held, the
	// first partial one) are compressed again.
	for i, name := range []string{"cm-000100", "cm-002500"} {
		rv++
		if err := st.Apply(store.Event{Type: store.Modified, Object: object(name, rv, 900+i, xs), RV: rv}); err != nil {
			t.Fatal(err)
		}
	}
	all = unnumbered(listItems(t, st, store.ListRequest{}))
	m0 = misses()
	if got, want := gunzip(t, streamBody(t, s, head, all, 0, tail)), plain(head, all, tail); !bytes.Equal(got, want) {
		t.Fatal("after changes: the body differs from the plain one")
	}
	if again := misses() - m0; again < 1 || again > 4 {
		t.Fatalf("2 changes compressed %v chunks again, want 1-4", again)
	}
	// Held items change where the first chunk starts, not the others.
	m0, h0 = misses(), hits()
	checkStream(t, s, head, all, 7, tail)
	if misses()-m0 > 2 || hits()-h0 < 20 {
		t.Fatalf("7 items held: %v chunks compressed, %v from the cache; want the first only compressed", misses()-m0, hits()-h0)
	}
}

// unnumbered copies items without their Store Seqs: what a front has.
func unnumbered(items []*store.Object) []*store.Object {
	out := make([]*store.Object, len(items))
	for i, o := range items {
		c := *o
		c.Seq = 0
		out[i] = &c
	}
	return out
}

// hashed copies items with their content hashes set, as a shard sends
// them.
func hashed(items []*store.Object) []*store.Object {
	out := make([]*store.Object, len(items))
	for i, o := range items {
		c := *o
		c.ContentHash = store.HashContent(o.Raw)
		out[i] = &c
	}
	return out
}

func checkStream(t testing.TB, s *Scope, head string, items []*store.Object, held int, tail string) {
	t.Helper()
	if got, want := gunzip(t, streamBody(t, s, head, items, held, tail)), plain(head, items, tail); !bytes.Equal(got, want) {
		t.Fatalf("%d held: decompresses to %d bytes that differ from the %d of the plain body", held, len(got), len(want))
	}
}

// Large items end their chunks at maxChunkBytes, small lists end in the
// last partial chunk, an empty stream writes nothing, and a stream scope
// (no separator) gives frames back to back.
func TestStreamShapes(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("secrets")
	big, _ := newStore(t, 12, 200<<10, xs)
	checkStream(t, s, "[", unnumbered(listItems(t, big, store.ListRequest{})), 0, "]")
	checkStream(t, s, "[", unnumbered(listItems(t, big, store.ListRequest{})), 1, "]")
	small, _ := newStore(t, 3, 100, xs)
	checkStream(t, s, "[", unnumbered(listItems(t, small, store.ListRequest{})), 0, "]")
	checkStream(t, s, "[", unnumbered(listItems(t, small, store.ListRequest{})), 3, "]")
	checkStream(t, s, "[", nil, 0, "]")

	frames := c.StreamScope("secrets")
	items := unnumbered(listItems(t, small, store.ListRequest{}))
	for range 2 {
		got := gunzip(t, streamBody(t, frames, "", items, 0, ""))
		var want []byte
		for _, o := range items {
			want = append(want, o.Raw...)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("stream scope: %q, want %q", got, want)
		}
	}
}

// A client that goes away mid-stream: Add reports the write error, and
// nothing half-written is kept.
func TestStreamClientGone(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("configmaps")
	st, _ := newStore(t, 2000, 1024, xs)
	all := unnumbered(listItems(t, st, store.ListRequest{}))
	gone := errors.New("client gone")
	w := s.NewWriter(&failAfter{n: 5 << 10, err: gone})
	stream := w.Stream(writeItem, false)
	var err error
	for _, o := range all {
		if err = stream.Add(o.Raw, 0); err != nil {
			break
		}
	}
	if !errors.Is(err, gone) {
		t.Fatalf("Add after the client went: %v, want %v", err, gone)
	}
	if err := w.Close(); !errors.Is(err, gone) {
		t.Fatalf("Close: %v, want %v", err, gone)
	}
	checkStream(t, s, "[", all, 0, "]")
}

// A Stream back in the pool holds no reference to the items of its body,
// however its chunks' lengths varied (a large object's buffer must not
// stay reachable from a pooled Stream).
func TestStreamReleaseDropsReferences(t *testing.T) {
	c := New(0, newMetrics())
	s := c.Scope("configmaps")
	st, _ := newStore(t, 300, 1024, xs)
	items := unnumbered(listItems(t, st, store.ListRequest{}))
	var out bytes.Buffer
	w := s.NewWriter(&out)
	stream := w.Stream(writeItem, false)
	for _, o := range items {
		if err := stream.Add(o.Raw, 0); err != nil {
			t.Fatal(err)
		}
	}
	_ = stream.Add(items[0].Raw, 0) // a last chunk of one item
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if cap(stream.objs) < 2 {
		t.Fatalf("the stream assembled chunks of at most %d items; the test needs longer ones", cap(stream.objs))
	}
	for i, o := range stream.objs[:cap(stream.objs)] {
		if o.Raw != nil {
			t.Fatalf("pooled stream: object %d still refers to %d bytes", i, len(o.Raw))
		}
	}
	for i, p := range stream.items[:cap(stream.items)] {
		if p != nil {
			t.Fatalf("pooled stream: item %d still set", i)
		}
	}
}

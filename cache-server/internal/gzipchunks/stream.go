package gzipchunks

import (
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Items handed over one at a time, by a server that has no Store Seqs for
// them: a fleet's front, whose LIST items and watch-list objects arrive
// from the shards' streams and live only during the call that passes them
// on. Compressing them was most of a front's CPU under a flood of full
// LISTs (hack/bench -mode flood -profile-dir: 60% of the front's samples
// in the level-1 compressor), for the same unchanged objects every time.
//
// Such an item's Seq is its content hash (store.HashContent: a 64-bit
// xxhash, never 0, which a shard computes once per change and sends along
// as the item's ContentHash): the same object state has the same bytes
// wherever and whenever a shard sends it, so chunks cut and kept by
// content repeat across LISTs as Store-Seq chunks do. A chunk's entry
// compares every item's Seq before it is used, so a wrong reuse needs two
// different items of the same resource, in the same place of the same
// range, with the same 64-bit hash: odds of 2^-64 per lookup. A Stream
// holds the items of the chunk being assembled (copied: at most
// maxChunkBytes plus one item) and writes the chunk, from the cache or
// compressed, once an item ends it.
//
// A Scope serves one kind of Seq: a Store's (Items) or content's
// (Stream). The two never meet in one Scope — a server's resource reads
// either its own Store or the shards — so a Store Seq can never be taken
// for a content hash.

// Stream writes a body's items, given one at a time, in chunks cut and
// kept by content (store.HashContent). It belongs to its Writer, whose Close
// writes what it holds and releases it.
type Stream struct {
	w     *Writer
	write func(dst ItemWriter, o *store.Object)
	// after: an item was written before the next chunk (it needs the
	// scope's separator).
	after bool
	// The chunk being assembled: its items' bytes, one after another in
	// buf, each ending at ends[i] with Seq seqs[i].
	buf   []byte
	ends  []int
	seqs  []uint64
	objs  []store.Object
	items []*store.Object
}

// Stream starts handing items to w one at a time; after says whether the
// body already holds items (written before w began, so the stream's first
// item needs a separator). write is Items' write: the same bytes for the
// same object state every time.
func (w *Writer) Stream(write func(dst ItemWriter, o *store.Object), after bool) *Stream {
	if w.stream == nil {
		w.stream = w.s.c.streams.Get().(*Stream)
	}
	s := w.stream
	s.w, s.write, s.after = w, write, after
	return s
}

// Add copies one item into the chunk being assembled and writes the chunk
// if the item ends it (chunkEnd's rule: a boundary Seq or maxChunkBytes).
// seq is store.HashContent(raw) when the caller has it (the item's ContentHash,
// sent by its shard), else 0 and Add hashes raw. It returns the body's
// first write error (a client gone): the caller should stop reading.
func (s *Stream) Add(raw []byte, seq uint64) error {
	if s.w.out.err != nil {
		return s.w.out.err
	}
	if seq == 0 {
		seq = store.HashContent(raw)
	}
	s.buf = append(s.buf, raw...)
	s.ends = append(s.ends, len(s.buf))
	s.seqs = append(s.seqs, seq)
	if boundary(seq) || len(s.buf) >= maxChunkBytes {
		s.End()
	}
	return s.w.out.err
}

// End writes the chunk assembled so far (the list's last, cut short by
// its end). The Writer's Write and Close call it first, so fresh bytes
// and the trailer always follow the items handed over before them.
func (s *Stream) End() {
	if len(s.ends) == 0 {
		return
	}
	// Sliced once the chunk is complete: buf may have moved as it grew.
	s.objs = s.objs[:0]
	start := 0
	for i, end := range s.ends {
		s.objs = append(s.objs, store.Object{Raw: s.buf[start:end:end], Seq: s.seqs[i]})
		start = end
	}
	s.items = s.items[:0]
	for i := range s.objs {
		s.items = append(s.items, &s.objs[i])
	}
	// Emptied before writing (the separator goes through Write, which
	// ends a pending chunk); the items still point into buf, which
	// nothing appends to until the chunk is written.
	s.buf, s.ends, s.seqs = s.buf[:0], s.ends[:0], s.seqs[:0]
	if s.after && len(s.w.s.sep) > 0 {
		_, _ = s.w.Write(s.w.s.sep)
	}
	s.w.chunk(s.items, true, s.write)
	s.after = true
}

// maxPooledStream bounds the chunk buffer a Stream keeps for reuse: a
// chunk of one large object is assembled in a buffer of its own.
const maxPooledStream = 2 * maxChunkBytes

// release returns s to the pool without its references to the body.
func (s *Stream) release(c *Cache) {
	// To capacity: a chunk shorter than an earlier one leaves the
	// earlier items' references past the length, which would keep a
	// large buffer alive in the pool.
	clear(s.objs[:cap(s.objs)])
	s.objs = s.objs[:0]
	clear(s.items[:cap(s.items)])
	s.items = s.items[:0]
	s.buf, s.ends, s.seqs = s.buf[:0], s.ends[:0], s.seqs[:0]
	if cap(s.buf) > maxPooledStream {
		s.buf = nil
	}
	s.w, s.write = nil, nil
	c.streams.Put(s)
}

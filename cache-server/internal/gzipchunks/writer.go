package gzipchunks

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"

	"github.com/klauspost/compress/flate"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Chunking. A chunk ends after an item whose Seq hashes to one of
// 1/chunkItems of the values, so chunks hold chunkItems items on average
// (~90 KiB of 1.4 KiB ConfigMaps: well above deflate's 32 KiB window, so
// cutting the window at chunk starts costs little ratio), and an update,
// which gives one object a new Seq, moves at most the boundary at that
// object. A chunk also ends once it holds maxChunkBytes, so large objects
// are chunks of their own rather than cache entries of many MiB.
const (
	chunkItems    = 64
	maxChunkBytes = 256 << 10
)

// boundary reports whether a chunk ends after the object numbered seq
// (Fibonacci hashing: consecutive Seqs spread over the top bits).
func boundary(seq uint64) bool {
	return (seq*0x9e3779b97f4a7c15)>>58 == 0 // top 6 bits: 1 in 64
}

// gzipHeader is compress/gzip's header at level 1 (no name, no time, XFL
// 4 = fastest, OS unknown): the bytes kube-apiserver's responses start
// with.
const gzipHeader = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"

// ItemWriter is where an item is written (a *bufio.Writer).
type ItemWriter interface {
	io.Writer
	io.ByteWriter
}

// Writer writes one gzip body. Write errors (a client gone) are kept and
// make later writes no-ops; Close returns the first.
type Writer struct {
	s   *Scope
	fw  *flate.Writer
	out sink
	// crc and size are of the uncompressed body so far.
	crc  uint32
	size int64
	// pending: fresh bytes were compressed since fw was last flushed.
	pending bool
	items   *bufio.Writer // a chunk's items on their way to fw
	stream  *Stream       // the items handed over one at a time, if any
}

// sink is where the compressor's output goes: the response, and while a
// chunk that can be kept is compressed, capture too.
type sink struct {
	dst       io.Writer
	capturing bool
	capture   []byte
	err       error
}

func (s *sink) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.capturing {
		s.capture = append(s.capture, p...)
	}
	n, err := s.dst.Write(p)
	if err != nil {
		s.err = err
	}
	return n, err
}

// crcWriter feeds the compressor and sums what it is fed.
type crcWriter struct {
	fw  *flate.Writer
	crc uint32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	c.crc = crc32.Update(c.crc, crc32.IEEETable, p)
	c.n += int64(len(p))
	return c.fw.Write(p)
}

// NewWriter starts a gzip body to dst (which should buffer: runs are
// written to it as they are, fresh output in blocks of a few KiB). Close
// must be called, whatever happened, to return the writer's buffers.
func (s *Scope) NewWriter(dst io.Writer) *Writer {
	w := &Writer{s: s, fw: s.c.deflaters.Get().(*flate.Writer), out: sink{dst: dst}}
	w.fw.Reset(&w.out)
	_, _ = io.WriteString(&w.out, gzipHeader)
	return w
}

// Write compresses fresh bytes (a list's head and tail): never cached.
func (w *Writer) Write(p []byte) (int, error) {
	if w.out.err != nil {
		return 0, w.out.err
	}
	if w.stream != nil {
		w.stream.End()
	}
	w.crc = crc32.Update(w.crc, crc32.IEEETable, p)
	w.size += int64(len(p))
	w.pending = true
	return w.fw.Write(p)
}

// Items writes items joined by the scope's separator (a list's commas),
// each by write, in chunks that are
// taken from the cache when an earlier body kept them for exactly these
// objects and compressed (and kept) otherwise. write must write the same
// bytes for the same object state every time (that is what lets a chunk
// be reused).
func (w *Writer) Items(items []*store.Object, write func(dst ItemWriter, o *store.Object)) {
	for start := 0; start < len(items); {
		end, keep := chunkEnd(items, start)
		if start > 0 && len(w.s.sep) > 0 {
			_, _ = w.Write(w.s.sep)
		}
		w.chunk(items[start:end], keep, write)
		start = end
	}
}

// chunkEnd is the end of the chunk starting at items[start], and whether
// it may be kept (every object has a Seq).
func chunkEnd(items []*store.Object, start int) (int, bool) {
	keep := true
	n := 0
	for i := start; i < len(items); i++ {
		o := items[i]
		if o.Seq == 0 {
			keep = false
		}
		n += len(o.Raw)
		if (o.Seq != 0 && boundary(o.Seq)) || n >= maxChunkBytes {
			return i + 1, keep
		}
	}
	return len(items), keep
}

// chunk writes one chunk: its cached run, or its items compressed from a
// reset compressor.
func (w *Writer) chunk(items []*store.Object, keep bool, write func(dst ItemWriter, o *store.Object)) {
	c := w.s.c
	if w.out.err != nil {
		return // the client is gone: nothing more to compress
	}
	key := entryKey{scope: w.s, first: items[0].Seq, last: items[len(items)-1].Seq, n: len(items)}
	if keep {
		if e := c.lookup(key, func(i int) uint64 { return items[i].Seq }); e != nil {
			w.s.hits.Inc()
			w.endFresh()
			_, _ = w.out.Write(e.run)
			w.crc = crcCombine(w.crc, e.crc, e.op)
			w.size += e.size
			// The compressor's window is not what the client decoded.
			w.fw.Reset(&w.out)
			return
		}
		w.s.misses.Inc()
	}
	w.endFresh()
	w.fw.Reset(&w.out)
	w.out.capture = w.out.capture[:0]
	w.out.capturing = keep
	cw := crcWriter{fw: w.fw}
	if w.items == nil {
		w.items = c.buffers.Get().(*bufio.Writer)
	}
	w.items.Reset(&cw)
	for i, o := range items {
		if i > 0 {
			_, _ = w.items.Write(w.s.sep)
		}
		write(w.items, o)
	}
	_ = w.items.Flush()
	err := w.fw.Flush()
	w.out.capturing = false
	op := c.x2n.shiftOp(cw.n)
	w.crc = crcCombine(w.crc, cw.crc, op)
	w.size += cw.n
	// A chunk that compresses to more than half its size is cheap to
	// compress again (the compressor skips through incompressible input)
	// and costly to keep.
	if keep && err == nil && w.out.err == nil && int64(len(w.out.capture))*2 <= cw.n {
		seqs := make([]uint64, len(items))
		for i, o := range items {
			seqs[i] = o.Seq
		}
		c.add(&entry{key: key, seqs: seqs, run: bytes.Clone(w.out.capture), size: cw.n, crc: cw.crc, op: op})
	}
}

// endFresh ends the fresh bytes compressed so far on a byte boundary, so a
// run can follow.
func (w *Writer) endFresh() {
	if w.pending {
		_ = w.fw.Flush()
		w.pending = false
	}
}

// Close ends the body (the final block and the trailer), returns the
// writer's buffers and reports the first write error.
func (w *Writer) Close() error {
	if w.stream != nil {
		w.stream.End()
	}
	err := w.fw.Close()
	if err == nil {
		var trailer [8]byte
		binary.LittleEndian.PutUint32(trailer[:4], w.crc)
		binary.LittleEndian.PutUint32(trailer[4:], uint32(w.size)) // ISIZE: the size modulo 2^32
		_, err = w.out.Write(trailer[:])
	}
	if w.out.err != nil {
		err = w.out.err
	}
	c := w.s.c
	w.fw.Reset(nil)
	c.deflaters.Put(w.fw)
	if w.items != nil {
		w.items.Reset(nil)
		c.buffers.Put(w.items)
	}
	if w.stream != nil {
		w.stream.release(c)
	}
	*w = Writer{}
	return err
}

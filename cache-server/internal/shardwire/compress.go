package shardwire

import (
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/s2"
)

// Compression of list answers between a shard and its fronts.
//
// A list answer carries every object of a range; between pods it crosses
// the network, and on any machine it costs TLS and socket copies on both
// sides per byte: profiles of a 2-shard fleet's full LIST had the shards'
// TLS writes and the front's TLS reads as the largest costs after the
// response gzip. S2 (a Snappy extension, klauspost/compress) compresses
// and decompresses at 2-3 GB/s per core, faster than those copies, and
// shrinks object JSON several times (docs/benchmarks.md, "Fleet").
//
// Negotiated per request, so fronts and shards of different versions work
// together: a front asks with "Accept-Encoding: s2", a shard that can
// answers with "Content-Encoding: s2". Only lists are compressed: change
// streams are long-lived and trickle, and an encoder per stream would hold
// its buffers for the life of the stream.
const EncodingS2 = "s2"

// s2BlockSize bounds what an encoder and a decoder hold: two blocks each.
const s2BlockSize = 64 << 10

// AcceptsS2 reports whether a shard request asks for S2.
func AcceptsS2(r *http.Request) bool {
	for tok := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		if strings.TrimSpace(tok) == EncodingS2 {
			return true
		}
	}
	return false
}

// Pools pools what shard streams need per request: S2 encoders and
// decoders and the Writers' and Readers' 64 KiB buffers (a fleet's page
// of 500 is a request per shard; fresh buffers were most of what a page
// allocated).
type Pools struct {
	enc, dec, writers, readers sync.Pool
}

// NewPools returns empty pools.
func NewPools() *Pools {
	return &Pools{
		enc: sync.Pool{New: func() any {
			return s2.NewWriter(nil, s2.WriterConcurrency(1), s2.WriterBlockSize(s2BlockSize))
		}},
		dec: sync.Pool{New: func() any {
			// The connection's TLS already proves integrity: the
			// stream's CRCs are not checked again.
			return s2.NewReader(nil, s2.ReaderMaxBlockSize(s2BlockSize), s2.ReaderIgnoreCRC())
		}},
		writers: sync.Pool{New: func() any { return NewWriter(nil) }},
		readers: sync.Pool{New: func() any { return NewReader(nil) }},
	}
}

// Writer is NewWriter from the pool; PutWriter returns it once flushed.
func (p *Pools) Writer(w io.Writer) *Writer {
	wr := p.writers.Get().(*Writer)
	wr.w.Reset(w)
	wr.under = w
	return wr
}

// PutWriter returns wr to the pool; it must not be used afterwards.
func (p *Pools) PutWriter(wr *Writer) {
	wr.w.Reset(nil)
	wr.under, wr.hashes, wr.items, wr.itemBytes = nil, false, 0, 0
	p.writers.Put(wr)
}

// Reader is NewReader from the pool.
func (p *Pools) Reader(r io.Reader) *Reader {
	rd := p.readers.Get().(*Reader)
	rd.r.Reset(r)
	return rd
}

// PutReader returns rd to the pool; it and every View read from it must
// not be used afterwards.
func (p *Pools) PutReader(rd *Reader) {
	rd.r.Reset(nil)
	p.readers.Put(rd)
}

// Encoder is an S2 stream to w. Flush sends what was written as complete
// blocks; Close ends the stream and returns the encoder to its pool.
type Encoder struct {
	c *Pools
	w *s2.Writer
}

// Encoder returns an encoder writing to w.
func (c *Pools) Encoder(w io.Writer) *Encoder {
	e := c.enc.Get().(*s2.Writer)
	e.Reset(w)
	return &Encoder{c: c, w: e}
}

func (e *Encoder) Write(p []byte) (int, error) { return e.w.Write(p) }

// Flush writes the buffered input as compressed blocks.
func (e *Encoder) Flush() error { return e.w.Flush() }

// Close flushes and releases the encoder; it must not be used afterwards.
func (e *Encoder) Close() error {
	err := e.w.Close()
	e.w.Reset(nil)
	e.c.enc.Put(e.w)
	e.w = nil
	return err
}

// Decoder returns a reader of the S2 stream in r and the function that
// releases it (after which it must not be used).
func (c *Pools) Decoder(r io.Reader) (io.Reader, func()) {
	d := c.dec.Get().(*s2.Reader)
	d.Reset(r)
	return d, func() {
		d.Reset(nil)
		c.dec.Put(d)
	}
}

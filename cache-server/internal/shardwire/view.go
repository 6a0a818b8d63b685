package shardwire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// View is an object record read in place: Key and Raw alias the Reader's
// buffer and are valid only until the Reader's next call. A front merging
// shards' lists into a response needs nothing else of an item, and reading
// it in place saves a copy and an allocation per object — on a 10k-object
// LIST most of the front's CPU was allocating, collecting and copying
// objects it only passed through (docs/benchmarks.md, "Fleet").
type View struct {
	Key, Namespace, Name []byte
	RV                   uint64
	Raw                  []byte
	// ContentHash is the hash the shard sent (KindHashedObject), else 0.
	ContentHash uint64
	// size is the whole record's length in the buffer.
	size int
	// attrs: the record carries labels or field values.
	attrs bool
}

// PeekObject returns the next record as a View, without consuming it
// (Skip does), when it is an object record that fits the Reader's buffer.
// ok is false when the next record is of another kind, larger than the
// buffer, or the stream ends or breaks before it is complete: Next then
// reads it (or reports the end or the error). An error is a record that
// cannot be valid whatever follows.
func (r *Reader) PeekObject() (v View, ok bool, err error) {
	want := 1
	for {
		if _, err := r.r.Peek(want); err != nil {
			// bufio.ErrBufferFull, io.EOF, a broken stream: Next's
			// business.
			return View{}, false, nil
		}
		b, _ := r.r.Peek(r.r.Buffered())
		if k := Kind(b[0]); k != KindObject && k != KindHashedObject {
			return View{}, false, nil
		}
		v, need, err := parseObjectView(b)
		if err != nil {
			return View{}, false, err
		}
		if need == 0 {
			// A record with labels or field values (Writer.Object) is
			// decoded whole: a View does not carry them.
			return v, !v.attrs, nil
		}
		if need > r.r.Size() {
			return View{}, false, nil
		}
		want = need
	}
}

// Skip consumes the record v was peeked from (PeekObject); v is invalid
// afterwards.
func (r *Reader) Skip(v View) error {
	_, err := r.r.Discard(v.size)
	return err
}

// errIncomplete: the buffer ends inside the record.
var errIncomplete = errors.New("incomplete")

// parseObjectView parses the object record at the start of b in place. need
// is 0 when b holds the whole record, else a length of b after which
// parsing can progress (the record is at least that long).
func parseObjectView(b []byte) (v View, need int, err error) {
	p := viewParser{b: b, off: 1}
	if Kind(b[0]) == KindHashedObject {
		v.ContentHash = p.fixed64()
	}
	v.Key = p.chunk(maxHeader)
	v.Namespace = p.chunk(maxHeader)
	v.Name = p.chunk(maxHeader)
	v.RV = p.uvarint()
	labels, fields := p.skipPairs(), p.skipPairs()
	v.attrs = labels+fields > 0
	v.Raw = p.chunk(maxRaw)
	switch {
	case p.err == errIncomplete:
		return View{}, p.need, nil
	case p.err != nil:
		return View{}, 0, p.err
	}
	v.size = p.off
	return v, 0, nil
}

// viewParser reads a record's parts from a buffer that may end early: after
// the first missing byte it records how much it needs and stops.
type viewParser struct {
	b    []byte
	off  int
	need int
	err  error
}

func (p *viewParser) uvarint() uint64 {
	if p.err != nil {
		return 0
	}
	x, n := binary.Uvarint(p.b[p.off:])
	switch {
	case n == 0:
		// Every byte left continues the varint: it needs at least one more.
		p.err, p.need = errIncomplete, len(p.b)+1
		return 0
	case n < 0:
		p.err = errors.New("shardwire: varint overflows 64 bits")
		return 0
	}
	p.off += n
	return x
}

func (p *viewParser) fixed64() uint64 {
	if p.err != nil {
		return 0
	}
	if len(p.b)-p.off < 8 {
		p.err, p.need = errIncomplete, p.off+8
		return 0
	}
	x := binary.LittleEndian.Uint64(p.b[p.off:])
	p.off += 8
	return x
}

func (p *viewParser) chunk(limit uint64) []byte {
	n := p.uvarint()
	if p.err != nil {
		return nil
	}
	if n > limit {
		p.err = fmt.Errorf("shardwire: record part of %d bytes exceeds the limit of %d", n, limit)
		return nil
	}
	if uint64(len(p.b)-p.off) < n {
		p.err, p.need = errIncomplete, p.off+int(n)
		return nil
	}
	c := p.b[p.off : p.off+int(n) : p.off+int(n)]
	p.off += int(n)
	return c
}

// skipPairs skips a map's pairs and returns how many there were.
func (p *viewParser) skipPairs() uint64 {
	n := p.uvarint()
	if p.err != nil {
		return 0
	}
	if n > maxPairs {
		p.err = fmt.Errorf("shardwire: %d labels or fields exceed the limit of %d", n, maxPairs)
		return 0
	}
	for range 2 * n {
		p.chunk(maxHeader)
		if p.err != nil {
			return 0
		}
	}
	return n
}

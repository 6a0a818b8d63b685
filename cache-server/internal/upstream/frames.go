package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/cachetier/cachetier/cache-server/internal/jsonscan"
)

// Watch streams without decoding. A watch response is a sequence of JSON
// objects, one per event ({"type":...,"object":{...}}). The tier stores an
// object's bytes as received and reads only a few of its metadata fields,
// so it splits the stream into frames and finds the object inside its
// frame with a scanner that tracks strings and nesting only; the object is
// parsed (and so validated) only when it is kept (decodeObject).
//
// json.Decoder, which this replaces, scanned every byte with its full
// state machine and copied every object (json.RawMessage) before the tier
// could look at it. A fleet's shard keeps the objects of its hash shards
// only: it allocated every object of the resource and kept one in N, and
// the ones it kept were scattered over memory the others had filled, which
// the Go heap cannot give back (a 2-shard fleet's shards held twice the
// heap of the objects they kept: docs/benchmarks.md, "Fleet").

// maxKeptFrameBuffer: a frame buffer grown past this by one large event is
// dropped after it, not kept for the life of the stream.
const maxKeptFrameBuffer = 1 << 20

// frameReader splits a watch response body into its top-level JSON values.
type frameReader struct {
	r   *bufio.Reader
	buf []byte
}

// Read buffer sizes: a watch that carries the resource's events reads
// 64 KiB at a time; the RV fetch's stream holds a bookmark (and at most
// one small object), and runs once per consistent read that is not
// coalesced with another: at 64 KiB each it was an eighth of the bytes a
// standalone tier allocated under a flood of consistent LISTs (~150 per
// second, docs/benchmarks.md "Floods"), and each of them brings the next
// collection closer.
const (
	streamBuffer      = 64 << 10
	shortStreamBuffer = 4 << 10
)

func newFrameReader(r io.Reader, size int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, size)}
}

// next returns the next frame: a view into a buffer that the following
// call reuses. At a clean end of the stream (nothing but whitespace after
// the last frame) it returns io.EOF; inside a frame, io.ErrUnexpectedEOF.
func (f *frameReader) next() ([]byte, error) {
	if cap(f.buf) > maxKeptFrameBuffer {
		f.buf = nil
	}
	f.buf = f.buf[:0]
	var sc frameScanner
	for {
		if f.r.Buffered() == 0 {
			if _, err := f.r.Peek(1); err != nil {
				if err == io.EOF && sc.started {
					return nil, io.ErrUnexpectedEOF
				}
				return nil, err
			}
		}
		chunk, _ := f.r.Peek(f.r.Buffered())
		skip, n, done, err := sc.scan(chunk)
		if err != nil {
			return nil, err
		}
		f.buf = append(f.buf, chunk[skip:n]...)
		if _, err := f.r.Discard(n); err != nil {
			return nil, err
		}
		if done {
			return f.buf, nil
		}
	}
}

// frameScanner finds the end of one JSON object in a stream read in
// chunks. It checks nesting and strings only: what is kept of a frame is
// parsed properly later.
type frameScanner struct {
	started  bool
	depth    int
	inString bool
	escaped  bool // the chunk ended right after a backslash in a string
}

var errNotAnObject = errors.New("watch stream: a frame is not a JSON object")

// scan consumes chunk up to the end of the object or of the chunk: skip is
// the whitespace before the object, n how much of chunk was consumed, done
// whether the object ended there.
func (s *frameScanner) scan(chunk []byte) (skip, n int, done bool, err error) {
	i := 0
	if !s.started {
		for i < len(chunk) && isSpace(chunk[i]) {
			i++
		}
		if i == len(chunk) {
			return i, i, false, nil
		}
		if chunk[i] != '{' {
			return 0, 0, false, errNotAnObject
		}
		s.started = true
		skip = i
	}
	// quote is the next '"' at or after i in a string (len(chunk): none),
	// found once and reused across the escapes before it: a string with
	// many escapes is scanned once, not once per escape.
	quote := -1
	for i < len(chunk) {
		if s.inString {
			if s.escaped {
				s.escaped = false
				i++
				continue
			}
			if quote < i {
				if q := bytes.IndexByte(chunk[i:], '"'); q >= 0 {
					quote = i + q
				} else {
					quote = len(chunk)
				}
			}
			if e := bytes.IndexByte(chunk[i:quote], '\\'); e >= 0 {
				// An escape: skip it and the character it escapes.
				if i += e + 2; i > len(chunk) {
					s.escaped, i = true, len(chunk)
				}
				continue
			}
			if quote == len(chunk) {
				i = len(chunk) // the string goes on in the next chunk
				continue
			}
			s.inString = false
			i = quote + 1
			continue
		}
		switch chunk[i] {
		case '"':
			s.inString = true
		case '{', '[':
			s.depth++
		case '}', ']':
			if s.depth--; s.depth == 0 {
				return skip, i + 1, true, nil
			}
		}
		i++
	}
	return skip, i, false, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// eventParts returns a watch frame's type and object (a view into frame),
// keys matched as json.Unmarshal matches them.
func eventParts(frame []byte) (typ string, object []byte, err error) {
	err = jsonscan.Members(frame, func(key, value []byte) error {
		switch {
		case bytes.EqualFold(key, []byte("type")):
			s, ok, err := jsonscan.String(value)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("watch event type is not a string: %.64s", value)
			}
			typ = s
		case bytes.EqualFold(key, []byte("object")):
			object = value
		}
		return nil
	})
	if err != nil {
		return "", nil, fmt.Errorf("watch stream: %w", err)
	}
	return typ, object, nil
}

// objectKey reads metadata.namespace, .name and .resourceVersion of an
// object's JSON without decoding it, as json.Unmarshal would (keys matched
// without regard to case, the last of duplicates winning). ok is false when it cannot tell
// cheaply (escaped strings, a value that is not a string, no metadata):
// the caller decodes the object then.
func objectKey(raw []byte) (ns, name, rv string, ok bool) {
	var meta []byte
	if err := jsonscan.Members(raw, func(key, value []byte) error {
		if bytes.EqualFold(key, []byte("metadata")) {
			meta = value
		}
		return nil
	}); err != nil || len(meta) == 0 || meta[0] != '{' {
		return "", "", "", false
	}
	ok = true
	err := jsonscan.Members(meta, func(key, value []byte) error {
		var dst *string
		switch {
		case bytes.EqualFold(key, []byte("namespace")):
			dst = &ns
		case bytes.EqualFold(key, []byte("name")):
			dst = &name
		case bytes.EqualFold(key, []byte("resourceVersion")):
			dst = &rv
		default:
			return nil
		}
		if len(value) < 2 || value[0] != '"' || bytes.IndexByte(value, '\\') >= 0 {
			ok = false
			return nil
		}
		*dst = string(value[1 : len(value)-1])
		return nil
	})
	return ns, name, rv, ok && err == nil
}

// Package shardwire is the framing between a fleet's shards and its fronts:
// a stream of records carrying objects' stored JSON bytes as they are
// (length-prefixed, never re-encoded or escaped), so a front merges shards'
// pages and events without parsing the objects themselves.
//
//	object    = 'O' meta bytes(raw)
//	hashed    = 'H' fixed64(contentHash) meta bytes(raw)   (an object; ParamContentHash)
//	event     = 'E' string(type) uvarint(rv) meta bytes(raw) (0 | 1 meta bytes(prevRaw))
//	other     = kind bytes(json header) bytes("")      (end, watermark, error)
//	meta      = string(key) string(namespace) string(name) uvarint(rv) pairs(labels) pairs(fields)
//	pairs     = uvarint(n) (string string)*n
//	string, bytes = uvarint(len) data
//	fixed64   = 8 bytes, little-endian
//
// Objects and events — one per item of a page, one per change — are binary
// (no JSON per object on either side); the rare records are JSON. Sizes
// are bounded on decode, so a corrupt or hostile stream is an error, never
// a huge allocation.
package shardwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// ResourceID names a resource in shard requests.
func ResourceID(gvr schema.GroupVersionResource) string {
	return gvr.Group + "/" + gvr.Version + "/" + gvr.Resource
}

// Paths of a shard's endpoints.
const (
	PathList      = "/shard/v1/list"
	PathWatch     = "/shard/v1/watch"
	PathCurrentRV = "/shard/v1/currentrv"
	PathWait      = "/shard/v1/wait"
	// ContentType of every shard response body.
	ContentType = "application/vnd.cachetier.shard-records"
)

// Kind says what a record carries.
type Kind byte

const (
	// KindObject is one item of a list, in key order.
	KindObject Kind = 'O'
	// KindHashedObject is a KindObject record that starts with the
	// object's content hash (store.Object.ContentHash), sent to a front
	// that asks for it (ParamContentHash). Readers return it as a
	// KindObject record whose object carries the hash.
	KindHashedObject Kind = 'H'
	// KindEnd ends a list: its RV, continuation and counts.
	KindEnd Kind = 'T'
	// KindEvent is one change of a followed resource, with its previous
	// state.
	KindEvent Kind = 'E'
	// KindWatermark says every event up to RV has been sent.
	KindWatermark Kind = 'W'
	// KindError ends a stream with an error.
	KindError Kind = 'X'
)

// Limits on decode. Objects are bounded by etcd's request size (1.5 MiB by
// default, configurable); 64 MiB is far above any real object.
const (
	maxHeader = 1 << 20
	maxRaw    = 64 << 20
	maxPairs  = 1 << 16
)

// Meta is what a front needs of an object besides its bytes: the key it
// merges by and what selectors and watch filters read.
type Meta struct {
	Key       string            `json:"k"`
	Namespace string            `json:"ns,omitempty"`
	Name      string            `json:"n"`
	RV        uint64            `json:"rv"`
	Labels    map[string]string `json:"l,omitempty"`
	Fields    map[string]string `json:"f,omitempty"`
}

// Header is a record's header; which fields are set depends on the kind.
type Header struct {
	// Type is the event type (KindEvent).
	Type string `json:"t,omitempty"`
	// RV: the event's, the list's snapshot, or the watermark.
	RV     uint64 `json:"rv,omitempty"`
	Object *Meta  `json:"o,omitempty"`
	Prev   *Meta  `json:"p,omitempty"`
	// KindEnd: Continue is the key to continue after ("" = complete);
	// Remaining the count after this page (unfiltered lists); LastKey the
	// last key of the shard's range at the snapshot, matching or not, so
	// a front can tell whether anything follows its merged page.
	Continue  string `json:"c,omitempty"`
	Remaining *int64 `json:"r,omitempty"`
	LastKey   string `json:"lk,omitempty"`
	// Uncached (KindWatermark): the apiserver serves the resource without
	// a watch cache (front.Source.UpstreamUncached).
	Uncached bool `json:"u,omitempty"`
	// Sizes (KindWatermark, every few seconds): the shard's object
	// counts, from which a front estimates what a read costs (its
	// priority-and-fairness work estimator).
	Sizes *store.Sizes `json:"sz,omitempty"`
	// SeatCPU (KindWatermark, with Sizes): the CPU in nanoseconds the
	// shard takes per seat's worth of read work (package seatcpu), which
	// a front adds to its own when it charges a LIST (0: unknown).
	SeatCPU int64 `json:"sc,omitempty"`
	// Error (KindError).
	Error *Error `json:"e,omitempty"`
}

// Error carries a shard's error to the front as the error value the front
// would have got in-process.
type Error struct {
	// Expired / TooLarge are the store's errors; otherwise Status.
	Expired  *store.ExpiredError `json:"expired,omitempty"`
	TooLarge *TooLarge           `json:"tooLarge,omitempty"`
	Status   *metav1.Status      `json:"status,omitempty"`
}

// TooLarge is store.TooLargeResourceVersionError without its context error.
type TooLarge struct {
	RV      uint64 `json:"rv"`
	Current uint64 `json:"current"`
}

// NewError wraps err for the wire.
func NewError(err error) *Error {
	var expired *store.ExpiredError
	var tooLarge *store.TooLargeResourceVersionError
	var status interface{ Status() metav1.Status }
	switch {
	case errors.As(err, &expired):
		return &Error{Expired: expired}
	case errors.As(err, &tooLarge):
		return &Error{TooLarge: &TooLarge{RV: tooLarge.RV, Current: tooLarge.Current}}
	case errors.As(err, &status):
		st := status.Status()
		return &Error{Status: &st}
	}
	return &Error{Status: &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Reason: metav1.StatusReasonInternalError, Message: err.Error()}}
}

// Err is the error value the record carries.
func (e *Error) Err() error {
	switch {
	case e.Expired != nil:
		return e.Expired
	case e.TooLarge != nil:
		return &store.TooLargeResourceVersionError{RV: e.TooLarge.RV, Current: e.TooLarge.Current}
	case e.Status != nil:
		return &statusError{*e.Status}
	}
	return errors.New("shard sent an empty error")
}

// statusError is an API status from a shard (apierrors.APIStatus).
type statusError struct{ st metav1.Status }

func (e *statusError) Error() string         { return e.st.Message }
func (e *statusError) Status() metav1.Status { return e.st }

// Record is one decoded record.
type Record struct {
	Kind   Kind
	Header Header
	// Object is the list item or the event's object; Prev the event's
	// previous state (nil if none).
	Object, Prev *store.Object
}

func (m *Meta) object(raw []byte) *store.Object {
	return &store.Object{Key: m.Key, Namespace: m.Namespace, Name: m.Name, RV: m.RV, Labels: m.Labels, Fields: m.Fields, Raw: raw}
}

// Writer encodes records.
type Writer struct {
	w     *bufio.Writer
	under io.Writer
	buf   []byte
	// hashes: objects that carry a content hash are sent with it
	// (SendContentHashes).
	hashes bool
	// items and itemBytes count the list items written (Written).
	items, itemBytes int64
}

// NewWriter writes records to w (buffered; call Flush, which flushes w too
// when it has a Flush method, e.g. an Encoder).
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriterSize(w, 64<<10), under: w} }

// Object writes a list item with its labels and field values.
func (w *Writer) Object(o *store.Object) error { return w.object(o, true) }

// Item writes a list item without labels and field values: what a page
// needs once the shard has applied the selectors.
func (w *Writer) Item(o *store.Object) error { return w.object(o, false) }

// SendContentHashes makes w send the content hash of every object that
// carries one (KindHashedObject): the front asked for them
// (WantsContentHashes).
func (w *Writer) SendContentHashes() { w.hashes = true }

// Written is the list items written so far and their objects' bytes:
// the work a shard's read did (package seatcpu).
func (w *Writer) Written() (items, bytes int64) { return w.items, w.itemBytes }

func (w *Writer) object(o *store.Object, attrs bool) error {
	w.items++
	w.itemBytes += int64(len(o.Raw))
	if w.hashes && o.ContentHash != 0 {
		w.buf = append(w.buf[:0], byte(KindHashedObject))
		w.buf = binary.LittleEndian.AppendUint64(w.buf, o.ContentHash)
	} else {
		w.buf = append(w.buf[:0], byte(KindObject))
	}
	w.buf = appendMeta(w.buf, o, attrs)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(o.Raw)))
	return w.send(o.Raw)
}

// Event writes a change; prev may be nil.
func (w *Writer) Event(typ string, rv uint64, o, prev *store.Object) error {
	w.buf = append(w.buf[:0], byte(KindEvent))
	w.buf = appendString(w.buf, typ)
	w.buf = binary.AppendUvarint(w.buf, rv)
	w.buf = appendMeta(w.buf, o, true)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(o.Raw)))
	if err := w.send(o.Raw); err != nil {
		return err
	}
	if prev == nil {
		w.buf = append(w.buf[:0], 0)
		return w.send(nil)
	}
	w.buf = append(w.buf[:0], 1)
	w.buf = appendMeta(w.buf, prev, true)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(prev.Raw)))
	return w.send(prev.Raw)
}

// send writes w.buf, then data.
func (w *Writer) send(data []byte) error {
	if _, err := w.w.Write(w.buf); err != nil {
		return err
	}
	_, err := w.w.Write(data)
	return err
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendPairs(b []byte, m map[string]string) []byte {
	b = binary.AppendUvarint(b, uint64(len(m)))
	for k, v := range m {
		b = appendString(appendString(b, k), v)
	}
	return b
}

func appendMeta(b []byte, o *store.Object, attrs bool) []byte {
	b = appendString(b, o.Key)
	b = appendString(b, o.Namespace)
	b = appendString(b, o.Name)
	b = binary.AppendUvarint(b, o.RV)
	if !attrs {
		return append(b, 0, 0)
	}
	return appendPairs(appendPairs(b, o.Labels), o.Fields)
}

// End writes a list's end.
func (w *Writer) End(h Header) error { return w.write(KindEnd, h) }

// Watermark writes progress.
func (w *Writer) Watermark(rv uint64, uncached bool) error {
	return w.write(KindWatermark, Header{RV: rv, Uncached: uncached})
}

// WatermarkWithSizes is Watermark carrying the shard's sizes and its CPU
// per seat's worth of work.
func (w *Writer) WatermarkWithSizes(rv uint64, uncached bool, sizes store.Sizes, seatCPU time.Duration) error {
	return w.write(KindWatermark, Header{RV: rv, Uncached: uncached, Sizes: &sizes, SeatCPU: int64(seatCPU)})
}

// Error writes an error record.
func (w *Writer) Error(err error) error {
	return w.write(KindError, Header{Error: NewError(err)})
}

// Flush sends what is buffered.
func (w *Writer) Flush() error {
	if err := w.w.Flush(); err != nil {
		return err
	}
	if f, ok := w.under.(interface{ Flush() error }); ok {
		return f.Flush()
	}
	return nil
}

func (w *Writer) write(k Kind, h Header) error {
	hdr, err := json.Marshal(h)
	if err != nil {
		return err
	}
	w.buf = append(w.buf[:0], byte(k))
	w.buf = binary.AppendUvarint(w.buf, uint64(len(hdr)))
	w.buf = append(w.buf, hdr...)
	w.buf = binary.AppendUvarint(w.buf, 0)
	_, err = w.w.Write(w.buf)
	return err
}

// Reader decodes records.
type Reader struct{ r *bufio.Reader }

// NewReader reads records from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next record; io.EOF at a clean end of stream, another
// error for a truncated or malformed one.
func (r *Reader) Next() (Record, error) {
	kind, err := r.r.ReadByte()
	if err != nil {
		return Record{}, err // io.EOF between records is a clean end
	}
	rec := Record{Kind: Kind(kind)}
	switch rec.Kind {
	case KindObject, KindHashedObject:
		var hash uint64
		if rec.Kind == KindHashedObject {
			var b [8]byte
			if _, err := io.ReadFull(r.r, b[:]); err != nil {
				return Record{}, truncated(err)
			}
			hash, rec.Kind = binary.LittleEndian.Uint64(b[:]), KindObject
		}
		if rec.Header.Object, rec.Object, err = r.object(); err != nil {
			return Record{}, err
		}
		rec.Object.ContentHash = hash
		return rec, nil
	case KindEvent:
		typ, err := r.chunk(maxHeader)
		if err != nil {
			return Record{}, err
		}
		rec.Header.Type = string(typ)
		if rec.Header.RV, err = binary.ReadUvarint(r.r); err != nil {
			return Record{}, truncated(err)
		}
		if rec.Header.Object, rec.Object, err = r.object(); err != nil {
			return Record{}, err
		}
		hasPrev, err := r.r.ReadByte()
		if err != nil {
			return Record{}, truncated(err)
		}
		switch hasPrev {
		case 0:
		case 1:
			if rec.Header.Prev, rec.Prev, err = r.object(); err != nil {
				return Record{}, err
			}
		default:
			return Record{}, fmt.Errorf("shardwire: bad previous-state flag %d", hasPrev)
		}
		return rec, nil
	case KindEnd, KindWatermark, KindError:
	default:
		return Record{}, fmt.Errorf("shardwire: unknown record kind %q", kind)
	}
	hdr, err := r.chunk(maxHeader)
	if err != nil {
		return Record{}, err
	}
	if err := json.Unmarshal(hdr, &rec.Header); err != nil {
		return Record{}, fmt.Errorf("shardwire: record header: %w", err)
	}
	if rec.Header.Object != nil || rec.Header.Prev != nil || rec.Header.Type != "" {
		return Record{}, errors.New("shardwire: object metadata in a record that carries none")
	}
	if raw, err := r.chunk(maxRaw); err != nil {
		return Record{}, err
	} else if len(raw) != 0 {
		return Record{}, errors.New("shardwire: payload in a record that carries none")
	}
	if rec.Kind == KindError && rec.Header.Error == nil {
		return Record{}, errors.New("shardwire: error record without error")
	}
	return rec, nil
}

// object reads an object's metadata and its stored bytes.
func (r *Reader) object() (*Meta, *store.Object, error) {
	m, err := r.meta()
	if err != nil {
		return nil, nil, err
	}
	raw, err := r.chunk(maxRaw)
	if err != nil {
		return nil, nil, err
	}
	return m, m.object(raw), nil
}

func (r *Reader) meta() (*Meta, error) {
	var m Meta
	var err error
	str := func() string {
		if err != nil {
			return ""
		}
		var b []byte
		b, err = r.chunk(maxHeader)
		return string(b)
	}
	pairs := func() map[string]string {
		if err != nil {
			return nil
		}
		var n uint64
		if n, err = binary.ReadUvarint(r.r); err != nil {
			err = truncated(err)
			return nil
		}
		if n == 0 {
			return nil
		}
		if n > maxPairs {
			err = fmt.Errorf("shardwire: %d labels or fields exceed the limit of %d", n, maxPairs)
			return nil
		}
		out := make(map[string]string, min(n, 64))
		for range n {
			k := str()
			v := str()
			if err != nil {
				return nil
			}
			out[k] = v
		}
		return out
	}
	m.Key, m.Namespace, m.Name = str(), str(), str()
	if err == nil {
		if m.RV, err = binary.ReadUvarint(r.r); err != nil {
			err = truncated(err)
		}
	}
	m.Labels = pairs()
	m.Fields = pairs()
	if err != nil {
		return nil, err
	}
	return &m, nil
}

func (r *Reader) chunk(limit uint64) ([]byte, error) {
	n, err := binary.ReadUvarint(r.r)
	if err != nil {
		return nil, truncated(err)
	}
	if n > limit {
		return nil, fmt.Errorf("shardwire: record part of %d bytes exceeds the limit of %d", n, limit)
	}
	if n <= 64<<10 {
		b := make([]byte, n)
		if _, err := io.ReadFull(r.r, b); err != nil {
			return nil, truncated(err)
		}
		return b, nil
	}
	// Grow with what actually arrives rather than trusting the prefix: a
	// truncated or hostile stream must not make us allocate its claim.
	var buf bytes.Buffer
	buf.Grow(64 << 10)
	if _, err := io.CopyN(&buf, r.r, int64(n)); err != nil {
		return nil, truncated(err)
	}
	return buf.Bytes(), nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

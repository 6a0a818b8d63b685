package jsonproto

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Plan converts the JSON of one Go type. It is safe for concurrent use.
type Plan struct {
	msg  *message
	pool *sync.Pool // of *converter, shared by the Plans that made it
}

// Conversion is the JSON of one object prepared by a plan (Plan.Prepare):
// indexed and sized once, then written as often as asked — to a buffer
// (Append) or in chunks to a writer (Write). Release returns its scratch
// space; the Conversion must not be used after.
type Conversion struct {
	p *Plan
	c *converter
	n int
}

// Prepare indexes and sizes the message of the object whose JSON is data.
// An error says the JSON does not fit the plan (or is not JSON): the typed
// conversion decides what it means.
func (p *Plan) Prepare(data []byte) (*Conversion, error) {
	c := p.get()
	n, err := c.prepare(p.msg, data)
	if err != nil {
		p.put(c)
		return nil, err
	}
	return &Conversion{p: p, c: c, n: n}, nil
}

// Size is the message's length.
func (cv *Conversion) Size() int { return cv.n }

// Release returns the conversion's scratch space to its plan.
func (cv *Conversion) Release() {
	cv.p.put(cv.c)
	cv.c = nil
}

// Append appends the message (no envelope) to dst. On error dst is
// returned unchanged in length.
func (cv *Conversion) Append(dst []byte) ([]byte, error) {
	c := cv.c
	start := len(dst)
	c.next, c.out = 0, slices.Grow(dst, cv.n)
	err := c.writeMessage(cv.p.msg, 0)
	out := c.out
	c.out = nil
	if err != nil {
		return dst, err
	}
	if len(out)-start != cv.n {
		return dst, fmt.Errorf("jsonproto: %s: wrote %d bytes, sized %d", cv.p.msg.name, len(out)-start, cv.n)
	}
	return out, nil
}

// Write writes the message to w in chunks, holding no buffer of the
// message's size: the way to send a large message to one reader. Only bad
// base64 can fail after the first byte (sizing does not decode it), so a
// caller that must not break its stream half-way writes to io.Discard
// once first; after that, an error is a failed write to w (the caller must
// not use w for more of the same stream).
func (cv *Conversion) Write(w io.Writer) error {
	c := cv.c
	c.next, c.w, c.written, c.werr = 0, w, 0, nil
	c.out = c.chunk[:0]
	err := c.writeMessage(cv.p.msg, 0)
	c.flush()
	c.chunk = c.out[:0]
	c.out, c.w = nil, nil
	switch {
	case err != nil:
		return err
	case c.werr != nil:
		return c.werr
	case c.written != cv.n:
		return fmt.Errorf("jsonproto: %s: wrote %d bytes, sized %d", cv.p.msg.name, c.written, cv.n)
	}
	return nil
}

// Append is Prepare, Conversion.Append and Release: the message of data
// appended to dst.
func (p *Plan) Append(dst, data []byte) ([]byte, error) {
	cv, err := p.Prepare(data)
	if err != nil {
		return dst, err
	}
	defer cv.Release()
	return cv.Append(dst)
}

func (p *Plan) get() *converter {
	if c, ok := p.pool.Get().(*converter); ok {
		return c
	}
	return &converter{}
}

func (p *Plan) put(c *converter) {
	// Keep the index of an ordinary object, not of a giant one.
	if cap(c.ix.nodes) > 1<<14 {
		c.ix.nodes = nil
	}
	if cap(c.strBuf) > 1<<16 {
		c.strBuf = nil
	}
	if cap(c.chunk) > 4*chunkBytes {
		c.chunk = nil
	}
	if len(c.keys) > 256 {
		c.keys = nil
	}
	if len(c.strs) > 256 {
		c.strs = nil
	}
	// A Write that panicked (in its writer) must not leave its writer
	// to the next conversion.
	c.ix.data, c.w, c.out = nil, nil, nil
	p.pool.Put(c)
}

// converter is the state of one conversion: the JSON's index, the sizes of
// its messages in the order they are written, scratch space for member
// lookups and map key order, and the output.
type converter struct {
	ix     index
	sizes  []int            // message sizes in write order (the size pass fills, the write pass consumes)
	next   int              // the write pass's position in sizes
	arena  []int32          // per-message member slots and sorted map entries, used as a stack
	keys   map[int32][]byte // unescaped member names, by node
	strs   map[int32][2]int // unquoted string values, by node: their span in strBuf
	strBuf []byte
	out    []byte

	// Streaming (Write): out is a chunk flushed to w when it fills, and
	// large byte runs go to w directly.
	w       io.Writer
	werr    error
	written int
	chunk   []byte
}

// chunkBytes is how much a streaming conversion collects before writing.
const chunkBytes = 32 << 10

// flush writes what out holds (streaming only).
func (c *converter) flush() {
	if c.w == nil {
		return
	}
	if c.werr == nil && len(c.out) > 0 {
		var n int
		n, c.werr = c.w.Write(c.out)
		c.written += n
	}
	c.out = c.out[:0]
}

// putBytes appends b to the message; when streaming, a large b is written
// to w as is (it is a slice of the JSON: no copy).
func (c *converter) putBytes(b []byte) {
	if c.w != nil && len(b) >= chunkBytes {
		c.flush()
		if c.werr == nil {
			var n int
			n, c.werr = c.w.Write(b)
			c.written += n
		}
		return
	}
	c.out = append(c.out, b...)
	if c.w != nil && len(c.out) >= chunkBytes {
		c.flush()
	}
}

// prepare indexes data and sizes its message.
func (c *converter) prepare(m *message, data []byte) (int, error) {
	if err := c.ix.parse(data); err != nil {
		return 0, err
	}
	if c.ix.nodes[0].kind != nObject {
		return 0, errors.New("jsonproto: not a JSON object")
	}
	c.sizes, c.next, c.arena = c.sizes[:0], 0, c.arena[:0]
	clear(c.keys)
	clear(c.strs)
	c.strBuf = c.strBuf[:0]
	return c.sizeMessage(m, 0)
}

var errNotFitting = errors.New("jsonproto: JSON value does not fit the type")

// members resolves the JSON members of object node obj (or none: -1) to
// m's fields: it pushes len(m.fields) slots onto the arena, each the member's
// node or -1, and returns the first slot's position.
func (c *converter) members(m *message, obj int32) (int, error) {
	base := len(c.arena)
	for range m.fields {
		c.arena = append(c.arena, -1)
	}
	if obj < 0 {
		return base, nil
	}
	nd := &c.ix.nodes[obj]
	switch nd.kind {
	case nNull:
		return base, nil
	case nObject:
	default:
		return 0, errNotFitting
	}
	for ch := nd.child; ch >= 0; ch = c.ix.nodes[ch].next {
		name, err := c.key(ch)
		if err != nil {
			return 0, err
		}
		i, ok := m.byJSON[string(name)]
		if !ok {
			continue // unknown members are dropped, as the typed decoder does
		}
		if c.arena[base+i] >= 0 {
			return 0, errors.New("jsonproto: duplicate member")
		}
		c.arena[base+i] = ch
	}
	return base, nil
}

// fieldNode is the node field i of a message gets: its member, the
// message's own object for an inline field, -1 when absent.
func (c *converter) fieldNode(f *field, base, i int, obj int32) int32 {
	switch {
	case f.noJSON:
		return -1
	case f.inline:
		return obj
	}
	return c.arena[base+i]
}

func (c *converter) isNull(n int32) bool { return n < 0 || c.ix.nodes[n].kind == nNull }

// ---- size pass ----

func (c *converter) sizeMessage(m *message, obj int32) (int, error) {
	slot := len(c.sizes)
	c.sizes = append(c.sizes, 0)
	base, err := c.members(m, obj)
	if err != nil {
		return 0, err
	}
	total := 0
	for i := range m.fields {
		f := &m.fields[i]
		n, err := c.sizeField(f, c.fieldNode(f, base, i, obj))
		if err != nil {
			return 0, err
		}
		total += n
	}
	c.arena = c.arena[:base]
	c.sizes[slot] = total
	return total, nil
}

func (c *converter) sizeField(f *field, nd int32) (int, error) {
	switch {
	case f.list:
		return c.eachElement(nd, func(el int32) (int, error) { return c.sizeValue(f, f.val, el, true) })
	case f.mapKey:
		return c.eachEntry(nd, func(key []byte, el int32) (int, error) {
			slot := len(c.sizes)
			c.sizes = append(c.sizes, 0)
			v, err := c.sizeValue(&mapValueField, f.val, el, false)
			if err != nil {
				return 0, err
			}
			entry := 1 + varintLen(uint64(len(key))) + len(key) + v
			c.sizes[slot] = entry
			return len(f.keyTag) + varintLen(uint64(entry)) + entry, nil
		})
	case f.ptr && c.isNull(nd):
		return 0, nil
	}
	return c.sizeValue(f, f.val, nd, false)
}

// mapValueField is field 2 of a map entry. Map values are strings, bytes
// or messages (the plan refuses others), all length-delimited.
var mapValueField = field{num: 2, keyTag: []byte{0x12}, wireLen: true}

// sizeValue is the size of one value of f (tag included), or 0 when the
// generated code would not write it.
func (c *converter) sizeValue(f *field, v value, nd int32, inList bool) (int, error) {
	tag := len(f.keyTag)
	switch v.kind {
	case kBool:
		if _, err := c.boolOf(nd); err != nil {
			return 0, err
		}
		return tag + 1, nil
	case kInt32, kInt64:
		x, err := c.intOf(nd, v.kind)
		if err != nil {
			return 0, err
		}
		return tag + varintLen(uint64(x)), nil
	case kBytes:
		if c.isNull(nd) && !inList {
			return 0, nil // a nil []byte is not written (a map's nil value neither)
		}
		n, err := c.bytesLen(nd)
		if err != nil {
			return 0, err
		}
		return tag + varintLen(uint64(n)) + n, nil
	case kMessage:
		n, err := c.sizeMessage(v.msg, nd)
		if err != nil {
			return 0, err
		}
		return tag + varintLen(uint64(n)) + n, nil
	}
	if nilList(f, v, nd, c) {
		return 0, nil
	}
	n, err := c.leafLen(v.kind, nd)
	if err != nil {
		return 0, err
	}
	return tag + varintLen(uint64(n)) + n, nil
}

// nilList: a named string list (metav1.Verbs) is a nullable message field,
// written only when the slice is not nil; as a map value it is always
// written.
func nilList(f *field, v value, nd int32, c *converter) bool {
	return v.kind == kStringList && f != &mapValueField && c.isNull(nd)
}

// leafLen is the payload length of a length-delimited value that is not a
// nested plan: a string or one of the special types.
func (c *converter) leafLen(k kind, nd int32) (int, error) {
	var n int
	err := c.leaf(k, nd, func(b []byte) { n += len(b) }, func(num int, x uint64) { n += 1 + varintLen(x) }, func(num int, b []byte) { n += 1 + varintLen(uint64(len(b))) + len(b) })
	return n, err
}

// eachElement calls fn for each element of array nd (none when null or
// absent) and sums what it returns.
func (c *converter) eachElement(nd int32, fn func(el int32) (int, error)) (int, error) {
	if c.isNull(nd) {
		return 0, nil
	}
	if c.ix.nodes[nd].kind != nArray {
		return 0, errNotFitting
	}
	total := 0
	for el := c.ix.nodes[nd].child; el >= 0; el = c.ix.nodes[el].next {
		n, err := fn(el)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// eachEntry calls fn for each member of object nd in key order, as the
// generated code writes map entries (sorted by key).
func (c *converter) eachEntry(nd int32, fn func(key []byte, el int32) (int, error)) (int, error) {
	if c.isNull(nd) {
		return 0, nil
	}
	if c.ix.nodes[nd].kind != nObject {
		return 0, errNotFitting
	}
	base := len(c.arena)
	sorted := true
	var prev []byte
	for ch := c.ix.nodes[nd].child; ch >= 0; ch = c.ix.nodes[ch].next {
		k, err := c.key(ch)
		if err != nil {
			return 0, err
		}
		if len(c.arena) > base && bytes.Compare(prev, k) >= 0 {
			sorted = false
		}
		prev = k
		c.arena = append(c.arena, ch)
	}
	n := len(c.arena) - base
	if !sorted {
		// Keys were unescaped above, so key cannot fail here.
		keyOf := func(x int32) []byte { k, _ := c.key(x); return k }
		entries := c.arena[base:]
		slices.SortStableFunc(entries, func(a, b int32) int { return bytes.Compare(keyOf(a), keyOf(b)) })
		for i := 1; i < len(entries); i++ {
			if bytes.Equal(keyOf(entries[i-1]), keyOf(entries[i])) {
				return 0, errors.New("jsonproto: duplicate map key")
			}
		}
	}
	total := 0
	for i := base; i < base+n; i++ {
		// fn may push onto the arena; entries are read by position.
		k, _ := c.key(c.arena[i])
		size, err := fn(k, c.arena[i])
		if err != nil {
			return 0, err
		}
		total += size
	}
	c.arena = c.arena[:base]
	return total, nil
}

// key is an object member's name as encoding/json reads it. Go's encoder
// escapes <, > and & (the apiserver's JSON has \u003c in label keys and the
// like); such keys (and invalid UTF-8, which decodes as U+FFFD) are
// unquoted once per conversion and kept.
func (c *converter) key(n int32) ([]byte, error) {
	nd := &c.ix.nodes[n]
	if raw := c.ix.data[nd.key0:nd.key1]; !nd.keyEsc && plainString(raw) {
		return raw, nil
	}
	if k, ok := c.keys[n]; ok {
		return k, nil
	}
	k, ok := unquote(nil, c.ix.data[nd.key0:nd.key1])
	if !ok {
		return nil, errNotFitting
	}
	if c.keys == nil {
		c.keys = map[int32][]byte{}
	}
	c.keys[n] = k
	return k, nil
}

// ---- values ----

func (c *converter) boolOf(nd int32) (bool, error) {
	if c.isNull(nd) {
		return false, nil
	}
	switch c.ix.nodes[nd].kind {
	case nTrue:
		return true, nil
	case nFalse:
		return false, nil
	}
	return false, errNotFitting
}

// intOf is an integer as the generated code puts it on the wire: an int32
// sign-extended to 64 bits.
func (c *converter) intOf(nd int32, k kind) (int64, error) {
	if c.isNull(nd) {
		return 0, nil
	}
	n := &c.ix.nodes[nd]
	if n.kind != nNumber {
		return 0, errNotFitting
	}
	bitSize := 64
	if k == kInt32 {
		bitSize = 32
	}
	return strconv.ParseInt(string(c.ix.data[n.start:n.end]), 10, bitSize)
}

// str is a JSON string's value: its bytes when they need no unquoting,
// otherwise what encoding/json makes of it (escapes resolved, invalid
// UTF-8 replaced, control characters refused), unquoted once per
// conversion into the converter's string space.
func (c *converter) str(nd int32) ([]byte, error) {
	n := &c.ix.nodes[nd]
	if n.kind != nString {
		return nil, errNotFitting
	}
	raw := c.ix.data[n.start:n.end]
	if !n.esc && plainString(raw) {
		return raw, nil
	}
	if span, ok := c.strs[nd]; ok {
		return c.strBuf[span[0]:span[1]:span[1]], nil
	}
	start := len(c.strBuf)
	// Unquoting shortens a string (only an invalid UTF-8 byte grows, into
	// U+FFFD): one allocation for a long escaped string, not a doubling series.
	c.strBuf = slices.Grow(c.strBuf, len(raw))
	var ok bool
	if c.strBuf, ok = unquote(c.strBuf, raw); !ok {
		c.strBuf = c.strBuf[:start]
		return nil, errNotFitting
	}
	if c.strs == nil {
		c.strs = map[int32][2]int{}
	}
	c.strs[nd] = [2]int{start, len(c.strBuf)}
	return c.strBuf[start:len(c.strBuf):len(c.strBuf)], nil
}

// bytesLen is the decoded length of a base64 string.
func (c *converter) bytesLen(nd int32) (int, error) {
	if c.isNull(nd) {
		return 0, nil
	}
	n := &c.ix.nodes[nd]
	if n.kind != nString {
		return 0, errNotFitting
	}
	raw := c.ix.data[n.start:n.end]
	if n.esc || bytes.IndexByte(raw, '\r') >= 0 || bytes.IndexByte(raw, '\n') >= 0 {
		b, err := c.bytesSlow(nd)
		return len(b), err
	}
	if len(raw)%4 != 0 {
		return 0, errNotFitting
	}
	l := len(raw) / 4 * 3
	if len(raw) > 0 && raw[len(raw)-1] == '=' {
		l--
		if raw[len(raw)-2] == '=' {
			l--
		}
	}
	return l, nil
}

// bytesSlow decodes a base64 string the way encoding/json does (escapes,
// line breaks).
func (c *converter) bytesSlow(nd int32) ([]byte, error) {
	n := &c.ix.nodes[nd]
	var b []byte
	if err := json.Unmarshal(c.ix.data[n.start-1:n.end+1], &b); err != nil {
		return nil, err
	}
	return b, nil
}

// rawJSON is a value's JSON as encoding/json hands it to an UnmarshalJSON
// method: the literal bytes, quotes included.
func (c *converter) rawJSON(nd int32) []byte {
	n := &c.ix.nodes[nd]
	if n.kind == nString {
		return c.ix.data[n.start-1 : n.end+1]
	}
	return c.ix.data[n.start:n.end]
}

// leaf emits the payload of a string or special-type value through three
// callbacks: raw payload bytes (a string), a varint field, a bytes field.
// Both passes use it, so sizes and bytes cannot disagree.
func (c *converter) leaf(k kind, nd int32, payload func([]byte), varint func(num int, x uint64), bytesField func(num int, b []byte)) error {
	null := c.isNull(nd)
	switch k {
	case kString:
		if null {
			return nil
		}
		s, err := c.str(nd)
		if err != nil {
			return err
		}
		payload(s)
	case kTime, kMicroTime:
		if null {
			return nil
		}
		s, err := c.str(nd)
		if err != nil {
			return err
		}
		layout := time.RFC3339
		if k == kMicroTime {
			layout = metav1.RFC3339Micro
		}
		t, err := time.Parse(layout, string(s))
		if err != nil {
			return err
		}
		if t.IsZero() {
			return nil
		}
		// metav1.Time's message has whole seconds (its JSON has no
		// fraction; a fraction that parses anyway is dropped), MicroTime's
		// microseconds.
		nanos := int64(0)
		if k == kMicroTime {
			nanos = int64(time.Duration(t.Nanosecond()).Truncate(time.Microsecond))
		}
		varint(1, uint64(t.Unix()))
		varint(2, uint64(nanos))
	case kDuration:
		if null {
			return errors.New("jsonproto: null duration") // as metav1.Duration's decoder says
		}
		s, err := c.str(nd)
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(string(s))
		if err != nil {
			return err
		}
		varint(1, uint64(d))
	case kQuantity:
		q := "0" // the zero Quantity's String()
		if !null {
			raw := c.rawJSON(nd)
			if l := len(raw); l >= 2 && raw[0] == '"' && raw[l-1] == '"' {
				raw = raw[1 : l-1]
			}
			parsed, err := resource.ParseQuantity(strings.TrimSpace(string(raw)))
			if err != nil {
				return err
			}
			q = parsed.String()
		}
		bytesField(1, []byte(q))
	case kIntOrString:
		var typ, iv int64
		var sv []byte
		if !null {
			switch c.ix.nodes[nd].kind {
			case nString:
				s, err := c.str(nd)
				if err != nil {
					return err
				}
				typ, sv = 1, s
			case nNumber:
				v, err := c.intOf(nd, kInt32)
				if err != nil {
					return err
				}
				iv = v
			default:
				return errNotFitting
			}
		}
		varint(1, uint64(typ))
		varint(2, uint64(iv))
		bytesField(3, sv)
	case kRaw:
		if !null {
			bytesField(1, c.rawJSON(nd))
		}
	case kStringList:
		if null {
			return nil
		}
		if c.ix.nodes[nd].kind != nArray {
			return errNotFitting
		}
		for el := c.ix.nodes[nd].child; el >= 0; el = c.ix.nodes[el].next {
			var s []byte
			if !c.isNull(el) {
				var err error
				if s, err = c.str(el); err != nil {
					return err
				}
			}
			bytesField(1, s)
		}
	default:
		return fmt.Errorf("jsonproto: leaf of kind %d", k)
	}
	return nil
}

// ---- write pass: the size pass again, appending ----

func (c *converter) writeMessage(m *message, obj int32) error {
	c.next++ // this message's own size, read by whoever wrote its length
	base, err := c.members(m, obj)
	if err != nil {
		return err
	}
	for i := range m.fields {
		f := &m.fields[i]
		if err := c.writeField(f, c.fieldNode(f, base, i, obj)); err != nil {
			return err
		}
		if c.w != nil && len(c.out) >= chunkBytes {
			c.flush()
		}
	}
	c.arena = c.arena[:base]
	return nil
}

func (c *converter) writeField(f *field, nd int32) error {
	switch {
	case f.list:
		_, err := c.eachElement(nd, func(el int32) (int, error) { return 0, c.writeValue(f, f.val, el, true) })
		return err
	case f.mapKey:
		_, err := c.eachEntry(nd, func(key []byte, el int32) (int, error) {
			entry := c.sizes[c.next]
			c.next++
			c.out = append(c.out, f.keyTag...)
			c.out = appendVarint(c.out, uint64(entry))
			c.out = append(c.out, 0x0a)
			c.out = appendVarint(c.out, uint64(len(key)))
			c.out = append(c.out, key...)
			return 0, c.writeValue(&mapValueField, f.val, el, false)
		})
		return err
	case f.ptr && c.isNull(nd):
		return nil
	}
	return c.writeValue(f, f.val, nd, false)
}

func (c *converter) writeValue(f *field, v value, nd int32, inList bool) error {
	tag := f.keyTag
	switch v.kind {
	case kBool:
		b, err := c.boolOf(nd)
		if err != nil {
			return err
		}
		c.out = append(c.out, tag...)
		if b {
			c.out = append(c.out, 1)
		} else {
			c.out = append(c.out, 0)
		}
		return nil
	case kInt32, kInt64:
		x, err := c.intOf(nd, v.kind)
		if err != nil {
			return err
		}
		c.out = append(c.out, tag...)
		c.out = appendVarint(c.out, uint64(x))
		return nil
	case kBytes:
		if c.isNull(nd) && !inList {
			return nil
		}
		return c.writeBytes(tag, nd)
	case kMessage:
		c.out = append(c.out, tag...)
		c.out = appendVarint(c.out, uint64(c.sizes[c.next]))
		return c.writeMessage(v.msg, nd)
	}
	if nilList(f, v, nd, c) {
		return nil
	}
	n, err := c.leafLen(v.kind, nd)
	if err != nil {
		return err
	}
	c.out = append(c.out, tag...)
	c.out = appendVarint(c.out, uint64(n))
	return c.leaf(v.kind, nd,
		c.putBytes,
		func(num int, x uint64) {
			c.out = append(c.out, byte(num<<3))
			c.out = appendVarint(c.out, x)
		},
		func(num int, b []byte) {
			c.out = append(c.out, byte(num<<3|2))
			c.out = appendVarint(c.out, uint64(len(b)))
			c.putBytes(b)
		})
}

// writeBytes decodes a base64 string straight into the output.
func (c *converter) writeBytes(tag []byte, nd int32) error {
	c.out = append(c.out, tag...)
	if c.isNull(nd) {
		c.out = append(c.out, 0)
		return nil
	}
	n := &c.ix.nodes[nd]
	raw := c.ix.data[n.start:n.end]
	if n.esc || bytes.IndexByte(raw, '\r') >= 0 || bytes.IndexByte(raw, '\n') >= 0 {
		b, err := c.bytesSlow(nd)
		if err != nil {
			return err
		}
		c.out = appendVarint(c.out, uint64(len(b)))
		c.putBytes(b)
		return nil
	}
	l, err := c.bytesLen(nd)
	if err != nil {
		return err
	}
	c.out = appendVarint(c.out, uint64(l))
	if c.w == nil {
		start := len(c.out)
		c.out = slices.Grow(c.out, l)[:start+l]
		got, err := base64.StdEncoding.Decode(c.out[start:], raw)
		if err != nil {
			return err
		}
		if got != l {
			return errNotFitting
		}
		return nil
	}
	// Streaming: decode a chunk at a time (whole quanta of 4 characters,
	// so each chunk decodes on its own), flushing as the chunk fills.
	got := 0
	for len(raw) > 0 {
		step := min(len(raw), chunkBytes/3*4)
		start := len(c.out)
		c.out = slices.Grow(c.out, step/4*3)[:start+step/4*3]
		n, err := base64.StdEncoding.Decode(c.out[start:], raw[:step])
		if err != nil {
			return err
		}
		c.out = c.out[:start+n]
		got += n
		raw = raw[step:]
		if len(c.out) >= chunkBytes {
			c.flush()
		}
	}
	if got != l {
		return errNotFitting
	}
	return nil
}

func appendVarint(b []byte, x uint64) []byte {
	for x >= 0x80 {
		b = append(b, byte(x)|0x80)
		x >>= 7
	}
	return append(b, byte(x))
}

func varintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

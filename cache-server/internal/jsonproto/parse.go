package jsonproto

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// nodeKind is a JSON value's type.
type nodeKind uint8

const (
	nNull nodeKind = iota
	nFalse
	nTrue
	nNumber
	nString
	nObject
	nArray
)

// node is one JSON value of an index. Offsets are into the indexed bytes;
// nothing is copied.
type node struct {
	start, end int32 // a string's bytes inside its quotes; any other value's whole span
	key0, key1 int32 // an object member's key, inside its quotes
	next       int32 // the next element or member of the same parent; -1 after the last
	child      int32 // an object's or array's first element or member; -1 when empty
	kind       nodeKind
	esc        bool // the string value has a backslash escape
	keyEsc     bool // the key has a backslash escape
}

// maxDepth bounds nesting. Built-in objects are a few dozen levels deep at
// most; deeper JSON goes the typed way (encoding/json allows 10,000).
const maxDepth = 512

var errSyntax = errors.New("jsonproto: JSON syntax")

// index is a parsed JSON document: one node per value, in document order,
// the root at 0.
type index struct {
	data  []byte
	nodes []node
}

func (ix *index) parse(data []byte) error {
	if len(data) > math.MaxInt32 {
		return fmt.Errorf("jsonproto: %d bytes of JSON", len(data))
	}
	ix.data = data
	ix.nodes = ix.nodes[:0]
	p, err := ix.value(skipSpace(data, 0), 0)
	if err != nil {
		return err
	}
	if skipSpace(data, p) != len(data) {
		return errSyntax
	}
	return nil
}

func skipSpace(d []byte, p int) int {
	for p < len(d) && (d[p] == ' ' || d[p] == '\n' || d[p] == '\t' || d[p] == '\r') {
		p++
	}
	return p
}

// value indexes the value at p and returns the position after it.
func (ix *index) value(p, depth int) (int, error) {
	d := ix.data
	if p >= len(d) {
		return 0, errSyntax
	}
	n := len(ix.nodes)
	ix.nodes = append(ix.nodes, node{start: int32(p), next: -1, child: -1})
	switch c := d[p]; {
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return 0, fmt.Errorf("jsonproto: JSON nested deeper than %d", maxDepth)
		}
		return ix.container(n, p, depth)
	case c == '"':
		end, esc, err := scanString(d, p+1)
		if err != nil {
			return 0, err
		}
		ix.nodes[n].kind, ix.nodes[n].start, ix.nodes[n].end, ix.nodes[n].esc = nString, int32(p+1), int32(end), esc
		return end + 1, nil
	case c == 't':
		return ix.literal(n, p, "true", nTrue)
	case c == 'f':
		return ix.literal(n, p, "false", nFalse)
	case c == 'n':
		return ix.literal(n, p, "null", nNull)
	default:
		end, err := scanNumber(d, p)
		if err != nil {
			return 0, err
		}
		ix.nodes[n].kind, ix.nodes[n].end = nNumber, int32(end)
		return end, nil
	}
}

func (ix *index) literal(n, p int, lit string, k nodeKind) (int, error) {
	if !bytes.HasPrefix(ix.data[p:], []byte(lit)) {
		return 0, errSyntax
	}
	ix.nodes[n].kind, ix.nodes[n].end = k, int32(p+len(lit))
	return p + len(lit), nil
}

// container indexes the object or array opening at p as node n.
func (ix *index) container(n, p, depth int) (int, error) {
	d := ix.data
	object := d[p] == '{'
	closer := byte(']')
	ix.nodes[n].kind = nArray
	if object {
		closer = '}'
		ix.nodes[n].kind = nObject
	}
	p = skipSpace(d, p+1)
	if p < len(d) && d[p] == closer {
		ix.nodes[n].end = int32(p + 1)
		return p + 1, nil
	}
	prev := int32(-1)
	for {
		var k0, k1 int
		var kesc bool
		if object {
			if p >= len(d) || d[p] != '"' {
				return 0, errSyntax
			}
			end, esc, err := scanString(d, p+1)
			if err != nil {
				return 0, err
			}
			k0, k1, kesc = p+1, end, esc
			p = skipSpace(d, end+1)
			if p >= len(d) || d[p] != ':' {
				return 0, errSyntax
			}
			p = skipSpace(d, p+1)
		}
		child := int32(len(ix.nodes))
		var err error
		if p, err = ix.value(p, depth+1); err != nil {
			return 0, err
		}
		if object {
			ix.nodes[child].key0, ix.nodes[child].key1, ix.nodes[child].keyEsc = int32(k0), int32(k1), kesc
		}
		if prev < 0 {
			ix.nodes[n].child = child
		} else {
			ix.nodes[prev].next = child
		}
		prev = child
		p = skipSpace(d, p)
		if p >= len(d) {
			return 0, errSyntax
		}
		if d[p] == closer {
			ix.nodes[n].end = int32(p + 1)
			return p + 1, nil
		}
		if d[p] != ',' {
			return 0, errSyntax
		}
		p = skipSpace(d, p+1)
	}
}

// scanString finds the closing quote of the string whose bytes start at p.
// Escapes are skipped, not checked: a string that has one is unquoted by
// encoding/json when it is used, which checks it.
//
// Linear in the string's length however many escapes it has: the quote
// found is searched for again only once an escape has consumed it (a
// string of newlines is a string of "\n" escapes, and searching from each
// to the closing quote again was quadratic).
func scanString(d []byte, p int) (end int, esc bool, err error) {
	q := -1 // the first quote at or after p
	for {
		if q < p {
			i := bytes.IndexByte(d[p:], '"')
			if i < 0 {
				return 0, false, errSyntax
			}
			q = p + i
		}
		b := bytes.IndexByte(d[p:q], '\\')
		if b < 0 {
			return q, esc, nil
		}
		esc = true
		p += b + 2 // the backslash and the byte it escapes (a quote, maybe)
		if p > len(d) {
			return 0, false, errSyntax
		}
	}
}

// scanNumber checks the JSON number grammar at p and returns its end.
func scanNumber(d []byte, p int) (int, error) {
	digits := func(p int) int {
		for p < len(d) && d[p] >= '0' && d[p] <= '9' {
			p++
		}
		return p
	}
	if p < len(d) && d[p] == '-' {
		p++
	}
	switch {
	case p < len(d) && d[p] == '0':
		p++
	case p < len(d) && d[p] >= '1' && d[p] <= '9':
		p = digits(p)
	default:
		return 0, errSyntax
	}
	if p < len(d) && d[p] == '.' {
		q := digits(p + 1)
		if q == p+1 {
			return 0, errSyntax
		}
		p = q
	}
	if p < len(d) && (d[p] == 'e' || d[p] == 'E') {
		p++
		if p < len(d) && (d[p] == '+' || d[p] == '-') {
			p++
		}
		q := digits(p)
		if q == p {
			return 0, errSyntax
		}
		p = q
	}
	return p, nil
}

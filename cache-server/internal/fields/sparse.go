package fields

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/fields"

	"github.com/cachetier/cachetier/cache-server/internal/jsonscan"
)

// Computing a field set from an object's JSON. The tier keeps objects as
// bytes and needs their field set once, at ingestion; decoding a whole
// 5 KiB Pod into map[string]any to read eight strings was most of the
// tier's CPU per Pod update (hack/bench -mode nodes' profile). SetJSON
// decodes only the members on the paths the resource's extract functions
// read (builtin.reads), into a map that is the full decode with everything
// else left out, and runs the same extract functions on it: the answer is
// the full decode's by construction, provided reads names every path they
// walk (TestSetJSONMatchesSet and FuzzSetJSON check that).

// pathTree holds the object members a field set reads: each key's subtree
// names the members read below it; a nil subtree, the whole value.
type pathTree map[string]pathTree

// newPathTree builds the tree of dotted paths ("spec.pool.name").
func newPathTree(paths []string) pathTree {
	t := pathTree{}
	for _, p := range paths {
		cur := t
		segs := strings.Split(p, ".")
		for i, s := range segs {
			if i == len(segs)-1 {
				cur[s] = nil // the whole value, whatever was read below it
				break
			}
			sub, seen := cur[s]
			if seen && sub == nil {
				break // already read whole
			}
			if sub == nil {
				sub = pathTree{}
				cur[s] = sub
			}
			cur = sub
		}
	}
	return t
}

// sparse decodes the members of the object raw that t names. An object on
// a path keeps only the members below it; any other value (a leaf, or a
// value that is not an object where the path expects one) is decoded whole
// as json.Decoder with UseNumber decodes it. Walking the result along t's
// paths finds what walking the full decode finds. raw must be valid JSON:
// what sparse skips is not checked.
func sparse(raw []byte, t pathTree) (map[string]any, error) {
	m := map[string]any{}
	err := jsonscan.Members(raw, func(key, value []byte) error {
		sub, ok := t[string(key)]
		if !ok {
			return nil
		}
		var v any
		var err error
		if sub != nil && len(value) > 0 && value[0] == '{' {
			v, err = sparse(value, sub)
		} else {
			v, err = decodeValue(value)
		}
		if err != nil {
			return err
		}
		// A key seen again replaces the value, as in a full decode.
		m[string(key)] = v
		return nil
	})
	return m, err
}

// decodeValue decodes one JSON value as json.Decoder with UseNumber does;
// strings and literals, the common leaves, without a decoder.
func decodeValue(v []byte) (any, error) {
	switch string(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	case "null":
		return nil, nil
	}
	if s, ok, err := jsonscan.String(v); ok || err != nil {
		return s, err
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("fields: data after the value %.32q", v)
	}
	return out, nil
}

// SetJSON is Set of the object whose JSON is raw, decoding only what the
// set reads (custom resources: the whole object). raw must be valid JSON
// (the tier's ingestion has parsed it already): the parts SetJSON skips
// are not checked.
func (r *Resource) SetJSON(raw []byte) (fields.Set, error) {
	var obj map[string]any
	var err error
	switch {
	case r.reads != nil && string(bytes.Trim(raw, " \t\r\n")) == "null":
		// What a full decode makes of it: no object, every field empty.
	case r.reads != nil:
		obj, err = sparse(raw, r.reads)
	default:
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		err = dec.Decode(&obj)
	}
	if err != nil {
		return nil, fmt.Errorf("fields: decode object: %w", err)
	}
	return r.Set(obj)
}

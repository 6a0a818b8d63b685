package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// FieldsFunc returns the field-selector values of a decoded object (see
// package fields); nil means only metadata.name/namespace.
type FieldsFunc func(obj map[string]any) map[string]string

// objectMeta is the part of an object the store indexes. Decoding into this
// small struct is cheaper than a full decode; the full map is only built
// when the resource has field-selector attributes beyond metadata.
type objectMeta struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
}

// DecodeObject turns the JSON of one object as received from the apiserver
// into a store object. raw is kept as the object's bytes (it is the wire
// encoding); see decodeObject.
func DecodeObject(raw []byte, fieldsOf FieldsFunc) (*store.Object, error) {
	return decodeObject(raw, fieldsOf, nil)
}

// decodeObject is DecodeObject with an optional reusable decoder for the
// full decode that fieldsOf needs (nil: a fresh one).
//
// Memory per stored object is what the tier is about, so:
//   - Namespace and Name are substrings of Key: one string allocation
//     instead of three (the store keeps every object for its lifetime);
//   - raw is kept only if it does not pin much more memory than its length
//     (a slice of a larger decode buffer would keep the whole buffer
//     alive); encoding/json's RawMessage is already an exact-size copy, so
//     this is a guard for other callers, not a copy on the hot path.
func decodeObject(raw []byte, fieldsOf FieldsFunc, nd *numberDecoder) (*store.Object, error) {
	var m objectMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	rv, err := ParseRV(m.Metadata.ResourceVersion)
	if err != nil {
		return nil, fmt.Errorf("object %s/%s: %w", m.Metadata.Namespace, m.Metadata.Name, err)
	}
	if cap(raw)-len(raw) > len(raw)/8+64 {
		raw = bytes.Clone(raw)
	}
	key := keyhash.Key(m.Metadata.Namespace, m.Metadata.Name)
	o := &store.Object{
		Key:       key,
		Namespace: key[:len(m.Metadata.Namespace)],
		Name:      key[len(key)-len(m.Metadata.Name):],
		RV:        rv,
		Labels:    m.Metadata.Labels,
		Raw:       raw,
	}
	var values map[string]string
	if fieldsOf != nil {
		if nd == nil {
			nd = newNumberDecoder()
		}
		full, err := nd.decode(raw)
		if err != nil {
			return nil, fmt.Errorf("decode object %s: %w", o.Key, err)
		}
		values = fieldsOf(full)
	}
	// metadata.name and metadata.namespace are answered from the object
	// itself (store.Object.FieldSet); a map holding only them would cost
	// ~250 bytes per object (a sixth of a 1.4 KiB ConfigMap).
	delete(values, "metadata.name")
	delete(values, "metadata.namespace")
	if len(values) > 0 {
		o.Fields = values
	}
	return o, nil
}

// numberDecoder decodes whole objects into map[string]any with UseNumber
// (integers above 2^53 stay exact in field values), reusing one
// json.Decoder and its buffer across objects. A fresh json.Decoder per
// object grows its buffer by doubling from 512 bytes until the object fits:
// about 4x the object's size in garbage per object (measured: ~2 KiB per
// 1.4 KiB ConfigMap, ~4.5 MiB per 1 MiB one), the largest single source of
// ingestion garbage after the map itself. Not safe for concurrent use; the
// ingester pools them.
type numberDecoder struct {
	src feedReader
	dec *json.Decoder
}

func newNumberDecoder() *numberDecoder {
	d := &numberDecoder{}
	d.dec = json.NewDecoder(&d.src)
	d.dec.UseNumber()
	return d
}

// decode decodes raw, which must hold exactly one JSON value (decodeObject
// has already validated it with json.Unmarshal). The decoder stops at the
// value's closing brace, so nothing of the next object is read early;
// trailing whitespace is skipped by the next decode. After an error the
// decoder is unusable (json.Decoder keeps its error): callers drop it.
func (d *numberDecoder) decode(raw []byte) (map[string]any, error) {
	d.src.b = raw
	var full map[string]any
	err := d.dec.Decode(&full)
	d.src.b = nil
	return full, err
}

// feedReader hands the decoder the current object's bytes.
type feedReader struct{ b []byte }

func (f *feedReader) Read(p []byte) (int, error) {
	if len(f.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, f.b)
	f.b = f.b[n:]
	return n, nil
}

// ParseRV parses a resourceVersion as the apiserver's etcd3 storage encodes
// it: a decimal uint64. Clients must treat RVs as opaque, but the tier is a
// mirror of this apiserver's storage and needs to order them.
func ParseRV(s string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty resourceVersion")
	}
	rv, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not a uint64: %w", s, err)
	}
	return rv, nil
}

package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
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
// into a store object. raw is kept as is (it is the wire encoding).
func DecodeObject(raw []byte, fieldsOf FieldsFunc) (*store.Object, error) {
	var m objectMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	rv, err := ParseRV(m.Metadata.ResourceVersion)
	if err != nil {
		return nil, fmt.Errorf("object %s/%s: %w", m.Metadata.Namespace, m.Metadata.Name, err)
	}
	o := &store.Object{
		Key:       keyhash.Key(m.Metadata.Namespace, m.Metadata.Name),
		Namespace: m.Metadata.Namespace,
		Name:      m.Metadata.Name,
		RV:        rv,
		Labels:    m.Metadata.Labels,
		Raw:       raw,
	}
	var values map[string]string
	if fieldsOf != nil {
		// UseNumber keeps integers above 2^53 exact in field values.
		var full map[string]any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&full); err != nil {
			return nil, fmt.Errorf("decode object %s: %w", o.Key, err)
		}
		values = fieldsOf(full)
	}
	if values == nil {
		values = make(map[string]string, 2)
	}
	values["metadata.name"] = o.Name
	if o.Namespace != "" {
		values["metadata.namespace"] = o.Namespace
	}
	o.Fields = values
	return o, nil
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

package upstream

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// FieldsFunc returns the field-selector values of an object from its JSON,
// which has been parsed (see package fields, Resource.SetJSON); nil means
// only metadata.name/namespace.
type FieldsFunc func(raw []byte) map[string]string

// DecodeObject turns the JSON of one object as received from the apiserver
// into a store object. raw is kept as the object's bytes (it is the wire
// encoding).
//
// Memory per stored object is what the tier is about, so:
//   - Namespace and Name are substrings of Key: one string allocation
//     instead of three (the store keeps every object for its lifetime);
//   - raw is kept only if it does not pin much more memory than its length
//     (a slice of a larger decode buffer would keep the whole buffer
//     alive); the ingester's copy of a stream's bytes is already exact-size,
//     so this is a guard for other callers, not a copy on the hot path.
func DecodeObject(raw []byte, fieldsOf FieldsFunc) (*store.Object, error) {
	m, err := decodeKeyMeta(raw)
	if err != nil {
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
		// raw has been parsed whole just above: the contract of SetJSON.
		values = fieldsOf(raw)
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

// Package jsonproto converts the JSON of a built-in Kubernetes object into
// the object's generated protobuf message without decoding it into Go
// types.
//
// The usual conversion (JSON -> typed Go object -> Marshal) allocates the
// whole object twice over: for a 500 KiB Secret that is ~1.2 MB of garbage
// and ~2 ms per conversion, which is why the tier cached every message next
// to the JSON — two copies of each object's data. This package reads the
// Go types' `json` and `protobuf` struct tags once, by reflection, into a
// plan per type, and then walks the JSON with that plan: a size pass and a
// write pass over a small index of the JSON's values, the only allocation
// being the output. Large values are not copied twice: strings are copied
// once into the message, base64 is decoded straight into it.
//
// The output is byte for byte what the generated (gogo) Marshal writes for
// the object the JSON decodes to — the same rules the apiserver's
// serializer follows: fields in number order; non-pointer scalars, strings
// and messages always written, pointers only when set, []byte when not
// nil; map entries sorted by key; metav1.Time/MicroTime empty when zero;
// resource.Quantity in canonical form; RawExtension/FieldsV1 as the raw
// JSON. Types whose shape the plan cannot express (an unknown custom JSON
// decoder, conflicting inline names, ...) are refused when the plan is
// built, and any JSON the plan does not fit (a wrong value type, a bad
// number, duplicate keys, ...) is refused when converted; callers fall back
// to the typed conversion then. Tests compare the output with the typed
// conversion for randomly filled objects of every kind client-go knows.
package jsonproto

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// kind is how one value is read from JSON and written as protobuf.
type kind uint8

const (
	kString      kind = iota // JSON string -> length-delimited UTF-8
	kBool                    // true/false -> varint
	kInt32                   // JSON integer -> varint (sign-extended)
	kInt64                   // JSON integer -> varint
	kBytes                   // base64 string -> length-delimited bytes
	kMessage                 // JSON object -> nested message (plan in msg)
	kTime                    // metav1.Time: RFC 3339 string -> Timestamp, empty when zero
	kMicroTime               // metav1.MicroTime: RFC 3339 with microseconds
	kDuration                // metav1.Duration: "1h2m" -> {1: nanoseconds}
	kQuantity                // resource.Quantity: canonical string in {1: string}
	kIntOrString             // intstr.IntOrString: {1: type, 2: intVal, 3: strVal}
	kRaw                     // runtime.RawExtension, metav1.FieldsV1: the raw JSON in {1: bytes}
	kStringList              // a named []string that is a message (ExtraValue): {1: repeated string}
)

// value is one protobuf value: a field's, a list element's, a map's key or
// value.
type value struct {
	kind kind
	msg  *message // kMessage
}

// field is one protobuf field of a message.
type field struct {
	num     int
	json    string // the JSON member name; "" for an inline (embedded) struct
	inline  bool   // the message's JSON members are the parent's
	ptr     bool   // a pointer: written only when the JSON has a non-null value
	list    bool   // repeated: one field per element
	mapKey  bool   // repeated map entry {1: key, 2: val}; key is always a string
	val     value  // the element's / map value's kind
	noJSON  bool   // `json:"-"`: never set from JSON, always its zero value
	keyTag  []byte // varint of (num << 3 | wire type), precomputed
	wireLen bool   // wire type 2 (length-delimited)
}

// message is the plan for one Go struct type.
type message struct {
	name   string
	fields []field        // in field-number order, as the generated code writes them
	byJSON map[string]int // JSON member name -> index in fields (inline fields excluded)
}

// Plans builds and keeps the per-type plans. It is safe for concurrent use.
type Plans struct {
	mu    sync.Mutex // serialises building; lookups do not take it
	plans sync.Map   // reflect.Type -> *planResult
	pool  sync.Pool  // of *converter: conversions reuse their scratch space
}

type planResult struct {
	plan *Plan
	err  error
}

// NewPlans returns an empty set of plans, built on first use of each type.
func NewPlans() *Plans { return &Plans{} }

// For returns the plan of Go struct type t (not a pointer), or why t cannot
// be converted without the typed path. It is called per message served:
// after a type's first use it is one lock-free map read.
func (p *Plans) For(t reflect.Type) (*Plan, error) {
	if r, ok := p.plans.Load(t); ok {
		return r.(*planResult).plan, r.(*planResult).err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.plans.Load(t); ok {
		return r.(*planResult).plan, r.(*planResult).err
	}
	b := builder{building: map[reflect.Type]*message{}}
	m, err := b.message(t)
	r := &planResult{err: err}
	if err == nil {
		r.plan = &Plan{msg: m, pool: &p.pool}
	}
	p.plans.Store(t, r)
	return r.plan, r.err
}

var (
	timeType      = reflect.TypeFor[metav1.Time]()
	microTimeType = reflect.TypeFor[metav1.MicroTime]()
	durationType  = reflect.TypeFor[metav1.Duration]()
	quantityType  = reflect.TypeFor[resource.Quantity]()
	intstrType    = reflect.TypeFor[intstr.IntOrString]()
	rawExtType    = reflect.TypeFor[runtime.RawExtension]()
	fieldsV1Type  = reflect.TypeFor[metav1.FieldsV1]()
	unmarshaler   = reflect.TypeFor[json.Unmarshaler]()
	marshalerType = reflect.TypeFor[interface{ Marshal() ([]byte, error) }]()
)

// builder turns Go types into plans. Recursive types (JSONSchemaProps-like)
// are resolved through the messages under construction.
type builder struct {
	building map[reflect.Type]*message
}

func (b *builder) message(t reflect.Type) (*message, error) {
	if m, ok := b.building[t]; ok {
		return m, nil
	}
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("jsonproto: %s is not a struct", t)
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return nil, fmt.Errorf("jsonproto: %s decodes its JSON itself", t)
	}
	m := &message{name: t.String(), byJSON: map[string]int{}}
	b.building[t] = m
	names := map[string]bool{} // every JSON name this struct's object claims, inline ones too
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		pbTag := sf.Tag.Get("protobuf")
		jsonName, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if pbTag == "" {
			// Not in the protobuf message (TypeMeta, for instance). Its JSON
			// members are ignored, but an inline one still claims names.
			if sf.Anonymous && jsonName == "" && sf.Type.Kind() == reflect.Struct {
				for _, n := range jsonNames(sf.Type) {
					if names[n] {
						return nil, fmt.Errorf("jsonproto: %s: JSON name %q claimed twice", t, n)
					}
					names[n] = true
				}
			}
			continue
		}
		if !sf.IsExported() {
			return nil, fmt.Errorf("jsonproto: %s.%s: unexported protobuf field", t, sf.Name)
		}
		f, err := b.field(t, sf, pbTag, jsonName)
		if err != nil {
			return nil, err
		}
		if f.inline {
			for _, n := range jsonNames(sf.Type) {
				if names[n] {
					return nil, fmt.Errorf("jsonproto: %s: JSON name %q claimed twice", t, n)
				}
				names[n] = true
			}
		} else if !f.noJSON {
			if names[f.json] {
				return nil, fmt.Errorf("jsonproto: %s: JSON name %q claimed twice", t, f.json)
			}
			names[f.json] = true
		}
		m.fields = append(m.fields, f)
	}
	// Generated code writes fields in number order; a struct's field order
	// almost always is that order, but do not rely on it.
	for i := 1; i < len(m.fields); i++ {
		for j := i; j > 0 && m.fields[j].num < m.fields[j-1].num; j-- {
			m.fields[j], m.fields[j-1] = m.fields[j-1], m.fields[j]
		}
	}
	for i := range m.fields {
		if i > 0 && m.fields[i].num == m.fields[i-1].num {
			return nil, fmt.Errorf("jsonproto: %s: field number %d used twice", t, m.fields[i].num)
		}
		if !m.fields[i].inline && !m.fields[i].noJSON {
			m.byJSON[m.fields[i].json] = i
		}
	}
	return m, nil
}

// jsonNames lists the JSON member names a struct's object has, following
// inline embedding.
func jsonNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch {
		case name == "-" || !sf.IsExported() && !sf.Anonymous:
		case sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct:
			out = append(out, jsonNames(sf.Type)...)
		case name == "":
			out = append(out, sf.Name)
		default:
			out = append(out, name)
		}
	}
	return out
}

func (b *builder) field(parent reflect.Type, sf reflect.StructField, pbTag, jsonName string) (field, error) {
	parts := strings.Split(pbTag, ",")
	if len(parts) < 3 {
		return field{}, fmt.Errorf("jsonproto: %s.%s: protobuf tag %q", parent, sf.Name, pbTag)
	}
	num, err := strconv.Atoi(parts[1])
	if err != nil || num <= 0 {
		return field{}, fmt.Errorf("jsonproto: %s.%s: protobuf tag %q", parent, sf.Name, pbTag)
	}
	f := field{num: num, json: jsonName}
	switch {
	case jsonName == "-":
		f.noJSON = true
	case sf.Anonymous && jsonName == "":
		f.inline = true
	case jsonName == "":
		f.json = sf.Name
	}
	t := sf.Type
	if f.inline && t.Kind() != reflect.Struct {
		return field{}, fmt.Errorf("jsonproto: %s.%s: inline %s", parent, sf.Name, t)
	}
	switch {
	case t.Kind() == reflect.Pointer:
		f.ptr = true
		t = t.Elem()
	case t.Kind() == reflect.Map:
		if t.Key().Kind() != reflect.String {
			return field{}, fmt.Errorf("jsonproto: %s.%s: map key %s", parent, sf.Name, t.Key())
		}
		f.mapKey = true
		t = t.Elem()
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8 && !isStringList(t):
		f.list = true
		t = t.Elem()
	}
	v, err := b.value(t)
	if err != nil {
		return field{}, fmt.Errorf("%w (in %s.%s)", err, parent, sf.Name)
	}
	if f.ptr && (v.kind == kStringList || t.Kind() == reflect.Slice || t.Kind() == reflect.Map) {
		return field{}, fmt.Errorf("jsonproto: %s.%s: pointer to %s", parent, sf.Name, t)
	}
	if f.inline && (f.ptr || v.kind != kMessage) {
		return field{}, fmt.Errorf("jsonproto: %s.%s: inline %s", parent, sf.Name, sf.Type)
	}
	if f.mapKey && !v.isLen() {
		return field{}, fmt.Errorf("jsonproto: %s.%s: map of %s", parent, sf.Name, t)
	}
	f.val = v
	// The wire type follows from the Go type; the tag's wire word does not
	// always agree with it (k8s.io/api has "bytes" on *int64 fields, which
	// the generated code writes as varints).
	wire := 0
	if f.mapKey || v.isLen() {
		wire = 2
		f.wireLen = true
	}
	f.keyTag = appendVarint(nil, uint64(num)<<3|uint64(wire))
	return f, nil
}

// isStringList: a named []string with its own Marshal is a message with
// one repeated string field (authentication's ExtraValue).
func isStringList(t reflect.Type) bool {
	return t.Kind() == reflect.Slice && t.Name() != "" && t.Elem().Kind() == reflect.String && t.Implements(marshalerType)
}

func (v value) isLen() bool {
	switch v.kind {
	case kBool, kInt32, kInt64:
		return false
	}
	return true
}

func (b *builder) value(t reflect.Type) (value, error) {
	switch t {
	case timeType:
		return value{kind: kTime}, nil
	case microTimeType:
		return value{kind: kMicroTime}, nil
	case durationType:
		return value{kind: kDuration}, nil
	case quantityType:
		return value{kind: kQuantity}, nil
	case intstrType:
		return value{kind: kIntOrString}, nil
	case rawExtType, fieldsV1Type:
		return value{kind: kRaw}, nil
	}
	if t.Kind() != reflect.Struct && reflect.PointerTo(t).Implements(unmarshaler) {
		return value{}, fmt.Errorf("jsonproto: %s decodes its JSON itself", t)
	}
	switch t.Kind() {
	case reflect.String:
		return value{kind: kString}, nil
	case reflect.Bool:
		return value{kind: kBool}, nil
	case reflect.Int32:
		return value{kind: kInt32}, nil
	case reflect.Int64:
		return value{kind: kInt64}, nil
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return value{kind: kBytes}, nil
		}
		if isStringList(t) {
			return value{kind: kStringList}, nil
		}
	case reflect.Struct:
		m, err := b.message(t)
		if err != nil {
			return value{}, err
		}
		return value{kind: kMessage, msg: m}, nil
	}
	return value{}, fmt.Errorf("jsonproto: no plan for %s", t)
}

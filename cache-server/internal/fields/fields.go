// Package fields computes, per resource, the field-selector values of an
// object and validates field selectors, as kube-apiserver does.
//
// Two things in the apiserver define field selectors for a resource:
//   - the field label conversion function registered for its kind
//     (k8s.io/kubernetes/pkg/apis/<group>/<version>/conversion.go,
//     AddFieldLabelConversionFunc; runtime.DefaultMetaV1FieldSelectorConversion
//     when none is registered; apiextensions' crConverter for custom
//     resources): which labels a request may use, how they are renamed, and
//     the error text for the others;
//   - the registry's GetAttrs (pkg/registry/<group>/<resource>/strategy.go
//     ToSelectableFields and friends): the fields.Set an object is matched
//     against.
//
// They do not always agree (e.g. apps/v1 replicasets put status.replicas in
// the set but no conversion accepts it; pods accept status.podIPs but never
// set it, so it only matches the empty value). This package mirrors both, as
// of Kubernetes 1.37.
package fields

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/jsonpath"
)

// Spec identifies a cached resource.
type Spec struct {
	GVR        schema.GroupVersionResource
	Kind       string
	Namespaced bool
	// Custom marks a custom resource (served by apiextensions-apiserver).
	Custom bool
	// SelectableFields are the CRD version's selectableFields[].jsonPath
	// values (e.g. ".spec.color"); only for custom resources.
	SelectableFields []string
}

// Resource is the compiled field-selector support of one resource. It is
// immutable and safe for concurrent use.
type Resource struct {
	spec    Spec
	convert func(label, value string) (string, string, error)
	// extra adds the resource-specific fields to the set; nil for resources
	// with only metadata fields.
	extra func(obj map[string]any, set fields.Set) error
	// custom are the compiled CRD selectable fields.
	custom []customField
	// apiserverIndexes: builtin.indexes.
	apiserverIndexes []string
	// reads are the members Set reads (builtin.reads and the metadata),
	// which is all SetJSON decodes; nil for custom resources (SetJSON
	// decodes them whole).
	reads pathTree
}

// metadataReads are the members Set reads of every object.
func metadataReads() []string { return []string{"metadata.name", "metadata.namespace"} }

type customField struct {
	name string
	path *jsonpath.JSONPath
}

// New compiles the field-selector support for spec.
func New(spec Spec) (*Resource, error) {
	r := &Resource{spec: spec}
	if spec.Custom {
		return r, r.compileCustom()
	}
	if len(spec.SelectableFields) > 0 {
		return nil, fmt.Errorf("fields: selectableFields are only supported for custom resources, not %s", spec.GVR)
	}
	b, ok := builtins()[spec.GVR.GroupResource()]
	if !ok {
		r.convert = runtime.DefaultMetaV1FieldSelectorConversion
		r.reads = newPathTree(metadataReads())
		return r, nil
	}
	r.convert = b.convert(spec.GVR.GroupVersion().WithKind(b.kind))
	r.extra = b.extra
	r.apiserverIndexes = b.indexes
	r.reads = newPathTree(append(metadataReads(), b.reads...))
	return r, nil
}

// APIServerIndexes are the fields kube-apiserver's watch cache keeps an
// index of for this resource (pods' and resourceslices' spec.nodeName).
// The tier indexes them too, and where the apiserver would answer a read
// from its index, the tier's answer follows the index's rules (a first
// page has a continuation only if more objects with the value follow).
func (r *Resource) APIServerIndexes() []string { return r.apiserverIndexes }

// CheckIndex rejects an index on a field that selectors cannot use for
// this resource, or that they know under another name (pods' spec.host is
// spec.nodeName): an index on it would never be read.
func (r *Resource) CheckIndex(field string) error {
	name, _, err := r.convert(field, "")
	switch {
	case err != nil:
		return fmt.Errorf("field %q cannot be indexed: %w", field, err)
	case name != field:
		return fmt.Errorf("field %q cannot be indexed: selectors name it %q", field, name)
	case field == "metadata.namespace":
		return fmt.Errorf("field %q cannot be indexed: objects are already kept in namespace order", field)
	}
	return nil
}

// ConvertFieldLabel is the resource's field label conversion; pass it to
// listparams.Options.ConvertFieldLabel.
func (r *Resource) ConvertFieldLabel(label, value string) (string, string, error) {
	return r.convert(label, value)
}

// ValidateSelector converts the labels of sel for this resource and rejects
// unsupported ones with the apiserver's 400 BadRequest (get.go listOpts:
// errors.NewBadRequest of the conversion error). The returned selector is
// the one to match against Set.
func (r *Resource) ValidateSelector(sel fields.Selector) (fields.Selector, error) {
	if sel == nil {
		return fields.Everything(), nil
	}
	out, err := sel.Transform(r.convert)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return out, nil
}

// NeedsObject reports whether Set reads more than the object's name and
// namespace. When it does not, ingestion can skip decoding the whole object
// (the metadata fields come from the small metadata decode it does anyway).
func (r *Resource) NeedsObject() bool { return r.extra != nil || len(r.custom) > 0 }

// Set returns the fields an object is matched against: metadata.name,
// metadata.namespace for namespaced resources, and the resource's own
// fields, with the apiserver's value formatting. obj is the object decoded
// from JSON; decode with json.Decoder.UseNumber to keep integers above 2^53
// exact.
func (r *Resource) Set(obj map[string]any) (fields.Set, error) {
	set := fields.Set{"metadata.name": str(obj, "metadata", "name")}
	if r.spec.Namespaced {
		set["metadata.namespace"] = str(obj, "metadata", "namespace")
	}
	if r.extra != nil {
		if err := r.extra(obj, set); err != nil {
			return nil, err
		}
	}
	for _, f := range r.custom {
		v, err := f.value(obj)
		if err != nil {
			return nil, err
		}
		set[f.name] = v
	}
	return set, nil
}

// compileCustom mirrors apiextensions-apiserver: the field name is the JSON
// path without its leading dot, evaluated with missing keys allowed
// (registry/customresource/strategy.go prepareSelectableFields), and the
// conversion accepts metadata.name, metadata.namespace when namespaced and
// the selectable fields (apiserver/conversion/converter.go ConvertFieldLabel).
func (r *Resource) compileCustom() error {
	allowed := map[string]bool{}
	for _, p := range r.spec.SelectableFields {
		jp := jsonpath.New("selectableField")
		jp.AllowMissingKeys(true)
		if err := jp.Parse("{" + p + "}"); err != nil {
			return fmt.Errorf("fields: selectable field %q of %s: %w", p, r.spec.GVR, err)
		}
		name := strings.TrimPrefix(p, ".")
		r.custom = append(r.custom, customField{name: name, path: jp})
		allowed[name] = true
	}
	namespaced := r.spec.Namespaced
	r.convert = func(label, value string) (string, string, error) {
		switch {
		case label == "metadata.name":
			return label, value, nil
		case namespaced && label == "metadata.namespace":
			return label, value, nil
		case allowed[label]:
			return label, value, nil
		}
		return "", "", fmt.Errorf("field label not supported: %s", label)
	}
	return nil
}

func (f customField) value(obj map[string]any) (string, error) {
	results, err := f.path.FindResults(obj)
	if err != nil {
		return "", fmt.Errorf("unexpected error finding value with jsonPath: %w", err)
	}
	if len(results) == 0 || len(results[0]) == 0 {
		return "", nil
	}
	if len(results) > 1 || len(results[0]) > 1 {
		return "", fmt.Errorf("unexpectedly received more than one JSON path result")
	}
	v := results[0][0].Interface()
	if v == nil {
		return "", nil
	}
	return format(v), nil
}

// format prints a JSON value the way fmt.Sprint prints the apiserver's
// unstructured value, where integers are int64 rather than float64.
func format(v any) string {
	switch n := v.(type) {
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return strconv.FormatInt(i, 10)
		}
		return n.String()
	case float64:
		if n == float64(int64(n)) {
			return strconv.FormatInt(int64(n), 10)
		}
	}
	return fmt.Sprint(v)
}

// get walks obj along path.
func get(obj map[string]any, path ...string) (any, bool) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// str returns the string at path, "" when absent (the Go zero value the
// typed object would have).
func str(obj map[string]any, path ...string) string {
	v, _ := get(obj, path...)
	s, _ := v.(string)
	return s
}

// boolean formats the bool at path like strconv.FormatBool / fmt.Sprint.
func boolean(obj map[string]any, path ...string) string {
	v, _ := get(obj, path...)
	b, _ := v.(bool)
	return strconv.FormatBool(b)
}

// integer formats the integer at path like strconv.Itoa; absent is 0.
func integer(obj map[string]any, path ...string) string {
	v, ok := get(obj, path...)
	if !ok || v == nil {
		return "0"
	}
	return format(v)
}

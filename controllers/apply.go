package controllers

import (
	"encoding/json"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Idempotent apply.
//
// Server-side apply is the right way to write children (the operator owns
// exactly the fields it sets; defaults and other managers' fields are left
// alone), but every apply is a write request even when nothing changes, and a
// reconcile of an unchanged profile must not write. So before applying, the
// desired object is compared with the observed one:
//
//   - every field the operator sets must already have that value in the
//     observed object (fields the apiserver or others added are ignored);
//   - the observed object must carry the hash of the desired object in
//     AnnotationDesiredHash. A field the operator stops setting (a removed
//     nodeSelector entry, say) does not show up as a difference of set
//     fields, but it changes the hash, and the apply then removes it because
//     the operator's field manager owned it. (The annotation is itself one
//     of the set fields; NeedsApply checks it first because it is cheap and
//     gives the clearer reason.)

// toApplyObject converts a built child to the unstructured form that is
// both applied and compared, with the desired-hash annotation set.
func toApplyObject(scheme *runtime.Scheme, obj client.Object) (*unstructured.Unstructured, error) {
	var u map[string]any
	if uo, ok := obj.(*unstructured.Unstructured); ok {
		u = runtime.DeepCopyJSON(uo.Object)
	} else {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil {
			return nil, err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, err
		}
		u = m
		u["apiVersion"], u["kind"] = gvks[0].GroupVersion().String(), gvks[0].Kind
	}
	delete(u, "status")
	pruneEmpty(u)
	out := &unstructured.Unstructured{Object: u}
	b, err := json.Marshal(u) // map keys are sorted: the hash is stable
	if err != nil {
		return nil, err
	}
	ann := out.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationDesiredHash] = hashBytes(b)
	out.SetAnnotations(ann)
	return out, nil
}

// pruneEmpty drops nulls and empty maps (creationTimestamp: null, resources:
// {}) that typed-to-unstructured conversion produces and the apiserver does
// not store, so they neither show up as differences nor claim ownership.
func pruneEmpty(m map[string]any) {
	for k, v := range m {
		switch t := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			pruneEmpty(t)
			if len(t) == 0 {
				delete(m, k)
			}
		case []any:
			for _, e := range t {
				if em, ok := e.(map[string]any); ok {
					pruneEmpty(em)
				}
			}
		}
	}
}

// NeedsApply says whether desired (from toApplyObject) must be applied over
// observed (nil when the object does not exist).
func NeedsApply(desired, observed *unstructured.Unstructured) (bool, string) {
	if observed == nil {
		return true, "missing"
	}
	if observed.GetAnnotations()[AnnotationDesiredHash] != desired.GetAnnotations()[AnnotationDesiredHash] {
		return true, "desired state changed"
	}
	if path, ok := subset(desired.Object, observed.Object, ""); !ok {
		return true, "drifted at " + path
	}
	return false, ""
}

// subset reports whether every value in want is present and equal in have,
// returning the first differing path.
func subset(want, have any, path string) (string, bool) {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return path, false
		}
		for k, wv := range w {
			if p, ok := subset(wv, h[k], path+"."+k); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return path, false
		}
		for i := range w {
			if p, ok := subset(w[i], h[i], fmt.Sprintf("%s[%d]", path, i)); !ok {
				return p, false
			}
		}
		return "", true
	default:
		if !scalarEqual(want, have) {
			return path, false
		}
		return "", true
	}
}

// scalarEqual compares JSON scalars; numbers may be int64 on one side and
// float64 on the other depending on how the object was decoded.
func scalarEqual(a, b any) bool {
	if fa, ok := toFloat(a); ok {
		fb, ok := toFloat(b)
		return ok && fa == fb
	}
	return reflect.DeepEqual(a, b)
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int32:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

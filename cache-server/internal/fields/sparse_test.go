package fields

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// everyBuiltin is a Resource of every built-in with selectable fields, and
// one without (configmaps: metadata only).
func everyBuiltin(t testing.TB) []*Resource {
	t.Helper()
	grs := slices.Collect(maps.Keys(builtins()))
	grs = append(grs, schema.GroupResource{Resource: "configmaps"})
	slices.SortFunc(grs, func(a, b schema.GroupResource) int { return strings.Compare(a.String(), b.String()) })
	var out []*Resource
	for _, gr := range grs {
		for _, namespaced := range []bool{true, false} {
			r, err := New(Spec{GVR: gr.WithVersion("v1"), Namespaced: namespaced})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
	}
	return out
}

// fullSet is Set of the whole object decoded as the tier did before
// SetJSON: json.Decoder with UseNumber into map[string]any.
func fullSet(r *Resource, raw []byte) (map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	return r.Set(obj)
}

// sameSet fails t when SetJSON's answer for raw differs from the full
// decode's (raw must be valid JSON).
func sameSet(t testing.TB, r *Resource, raw []byte) {
	t.Helper()
	want, werr := fullSet(r, raw)
	got, gerr := r.SetJSON(raw)
	if (werr != nil) != (gerr != nil) || !maps.Equal(map[string]string(got), want) {
		t.Fatalf("%s of %s:\nSetJSON %v (err %v)\nfull    %v (err %v)", r.spec.GVR.GroupResource(), raw, got, gerr, want, werr)
	}
}

func goldenObjects(t testing.TB) map[string][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "objects", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("golden objects: %v (%d)", err, len(files))
	}
	out := map[string][]byte{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(f)] = raw
	}
	return out
}

// SetJSON answers what Set of the full decode answers for every golden
// object, read as every built-in resource (the kinds' fields cross: a
// Pod's spec.nodeName read as a ResourceSlice).
func TestSetJSONMatchesSet(t *testing.T) {
	for _, raw := range goldenObjects(t) {
		for _, r := range everyBuiltin(t) {
			sameSet(t, r, raw)
		}
	}
}

// odd are values a member on a read path may hold, of every JSON type,
// with escapes and numbers a float64 cannot hold.
var oddValues = []string{
	`"v"`, `""`, `"\u00e9\n\"x"`, "\"\xff\"", `5`, `-0`, `9007199254740993`, `1.5e300`, `true`, `false`, `null`,
	`[]`, `[{"ip":"10.0.0.1"},{"ip":"fd00::1"}]`, `[{"ip":5}]`, `["x"]`, `{}`, `{"name":"n","component":"c","ip":"i"}`,
}

// Every read path of every built-in, and every prefix of one, holding
// values of every type, in every golden object: SetJSON answers as the
// full decode does. A path extract walks that reads does not name shows
// up here as a value the full decode sees and SetJSON does not.
func TestSetJSONOddValues(t *testing.T) {
	golden := goldenObjects(t)
	for _, r := range everyBuiltin(t) {
		var paths []string
		var walk func(prefix string, tr pathTree)
		walk = func(prefix string, tr pathTree) {
			for k, sub := range tr {
				paths = append(paths, prefix+k)
				walk(prefix+k+".", sub)
			}
		}
		walk("", r.reads)
		for _, name := range slices.Sorted(maps.Keys(golden)) {
			var obj map[string]any
			if err := json.Unmarshal(golden[name], &obj); err != nil {
				t.Fatal(err)
			}
			for _, p := range paths {
				for _, v := range oddValues {
					sameSet(t, r, withValue(t, obj, strings.Split(p, "."), v))
				}
			}
		}
	}
}

// withValue is the JSON of obj with the member at path set to the JSON
// value v (objects created on the way).
func withValue(t testing.TB, obj map[string]any, path []string, v string) []byte {
	t.Helper()
	raw, err := json.Marshal(setPath(obj, path, json.RawMessage(v)))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func setPath(obj map[string]any, path []string, v any) map[string]any {
	out := maps.Clone(obj)
	if out == nil {
		out = map[string]any{}
	}
	if len(path) == 1 {
		out[path[0]] = v
		return out
	}
	sub, _ := out[path[0]].(map[string]any)
	out[path[0]] = setPath(sub, path[1:], v)
	return out
}

// Duplicate keys (the last wins, whole), keys written with escapes, and
// objects that are not objects where a path expects one.
func TestSetJSONShapes(t *testing.T) {
	pods := mustNew(t, Spec{GVR: gvr("", "v1", "pods"), Namespaced: true})
	for _, raw := range []string{
		`{"metadata":{"name":"a"},"spec":{"nodeName":"n1","hostNetwork":true},"spec":{"nodeName":"n2"}}`,
		`{"spec":{"nodeName":"n1"},"spec":"x"}`,
		`{"spec":"x","spec":{"nodeName":"n1"}}`,
		`{"\u0073pec":{"node\u004eame":"n1"},"metadata":{"n\u0061me":"p","namespace":"ns"}}`,
		`{"Spec":{"nodeName":"n1"},"spec":{"NodeName":"n2"}}`,
		`{"status":{"podIPs":[],"podIP":"1"}}`, `{"status":{"podIPs":[{"ip":"2"}],"podIP":"1"}}`,
		`{"status":{"podIPs":{"ip":"2"},"podIP":"1"}}`, `{"status":{"podIPs":[null],"podIP":"1"}}`,
		`{"spec":[{"nodeName":"n1"}]}`, `{"spec":null}`, `{}`, `null`, ` {"spec" : { "nodeName" : "n1" } } `,
		`{"metadata":{"name":"p","name":"q","namespace":null}}`,
	} {
		sameSet(t, pods, []byte(raw))
	}
	for _, bad := range []string{`[]`, `"x"`, `5`} {
		if _, err := pods.SetJSON([]byte(bad)); err == nil {
			t.Errorf("SetJSON(%s): no error", bad)
		}
	}
}

func FuzzSetJSON(f *testing.F) {
	for _, raw := range goldenObjects(f) {
		f.Add(raw)
	}
	f.Add([]byte(`{"spec":{"nodeName":"n1"},"spec":{"nodeName":"\u00e9"},"status":{"podIPs":[{"ip":1}],"replicas":1e2}}`))
	resources := everyBuiltin(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			// Outside SetJSON's contract (the tier has parsed the object
			// already): any answer but a crash.
			for _, r := range resources {
				_, _ = r.SetJSON(raw)
			}
			return
		}
		for _, r := range resources {
			sameSet(t, r, raw)
		}
	})
}

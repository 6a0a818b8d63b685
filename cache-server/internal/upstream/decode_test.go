package upstream

import (
	"bytes"
	"encoding/json"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/fields"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

func TestWithTypeMeta(t *testing.T) {
	res := Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod"}
	cases := map[string]string{
		`{"metadata":{"name":"a"}}`: `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}}`,
		`{}`:                        `{"kind":"Pod","apiVersion":"v1"}`,
		`{"kind":"Pod","apiVersion":"v1","metadata":{}}`: `{"kind":"Pod","apiVersion":"v1","metadata":{}}`,
	}
	for in, want := range cases {
		if got := string(withTypeMeta([]byte(in), res)); got != want {
			t.Errorf("withTypeMeta(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestDecodeObject(t *testing.T) {
	raw := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"42","labels":{"a":"b"}},"spec":{"nodeName":"n1"}}`)
	o, err := DecodeObject(raw, podFields(t))
	if err != nil {
		t.Fatal(err)
	}
	fs := o.FieldSet()
	if o.Key != "ns/p" || o.RV != 42 || o.Labels["a"] != "b" || fs.Get("spec.nodeName") != "n1" ||
		fs.Get("metadata.name") != "p" || fs.Get("metadata.namespace") != "ns" || string(o.Raw) != string(raw) {
		t.Fatalf("decoded %+v", o)
	}
	// Hashed by a shard's ingester only (TestDecodeContentHashes).
	if o.ContentHash != 0 {
		t.Errorf("ContentHash %x, want none", o.ContentHash)
	}
	// name and namespace are not kept twice: the object answers them.
	if _, ok := o.Fields["metadata.name"]; ok || len(o.Fields) != 8 {
		t.Errorf("Fields = %v, want the pod's eight fields beyond metadata", o.Fields)
	}
	for _, bad := range []string{`{`, `{"metadata":{"name":"x","resourceVersion":"abc"}}`, `{"metadata":{"name":"x"}}`} {
		if _, err := DecodeObject([]byte(bad), nil); err == nil {
			t.Errorf("DecodeObject(%s): want error", bad)
		}
	}
}

// A shard's ingester stores each object with its content hash, for its
// fronts; other ingesters do not hash. Objects of keys the shard does not
// own are not decoded, so not hashed either.
func TestDecodeContentHashes(t *testing.T) {
	raw := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}`)
	for _, c := range []struct {
		opts Options
		want uint64
	}{
		{Options{}, 0},
		{Options{ContentHashes: true}, store.HashContent(raw)},
		{Options{ContentHashes: true, Owns: func(string) bool { return false }}, 0},
	} {
		o, err := (&Ingester{opts: c.opts}).decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		if o.ContentHash != c.want || o.RV != 7 {
			t.Errorf("hashes %v, owns nothing %v: ContentHash %x RV %d, want %x and 7", c.opts.ContentHashes, c.opts.Owns != nil, o.ContentHash, o.RV, c.want)
		}
	}
}

// Namespace and Name share Key's bytes; cluster-scoped objects have Key ==
// Name.
func TestDecodeObjectNames(t *testing.T) {
	for _, c := range []struct{ raw, key, ns, name string }{
		{`{"metadata":{"name":"p","namespace":"ns","resourceVersion":"1"}}`, "ns/p", "ns", "p"},
		{`{"metadata":{"name":"node-1","resourceVersion":"1"}}`, "node-1", "", "node-1"},
	} {
		o, err := DecodeObject([]byte(c.raw), nil)
		if err != nil {
			t.Fatal(err)
		}
		if o.Key != c.key || o.Namespace != c.ns || o.Name != c.name {
			t.Errorf("%s: key %q namespace %q name %q", c.raw, o.Key, o.Namespace, o.Name)
		}
		fs := o.FieldSet()
		if fs.Get("metadata.name") != c.name || fs.Get("metadata.namespace") != c.ns || fs.Has("metadata.namespace") != (c.ns != "") || o.Fields != nil {
			t.Errorf("%s: field set name %q namespace %q, map %v", c.raw, fs.Get("metadata.name"), fs.Get("metadata.namespace"), o.Fields)
		}
	}
}

// The bench's Pod event: its stored field values are the full decode's
// field set (package fields' equivalence tests, end to end through
// DecodeObject), without the metadata the object answers itself.
func TestDecodeObjectFieldsOfBenchPod(t *testing.T) {
	_, obj, err := eventParts(benchPodEvent(t))
	if err != nil {
		t.Fatal(err)
	}
	o, err := DecodeObject(obj, podFields(t))
	if err != nil {
		t.Fatal(err)
	}
	r, err := fields.New(fields.Spec{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod", Namespaced: true})
	if err != nil {
		t.Fatal(err)
	}
	var full map[string]any
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.UseNumber()
	if err := dec.Decode(&full); err != nil {
		t.Fatal(err)
	}
	want, err := r.Set(full)
	if err != nil {
		t.Fatal(err)
	}
	delete(want, "metadata.name")
	delete(want, "metadata.namespace")
	if !maps.Equal(o.Fields, map[string]string(want)) || want["spec.nodeName"] != "node-00300" {
		t.Errorf("Fields %v, full decode's set %v", o.Fields, want)
	}
}

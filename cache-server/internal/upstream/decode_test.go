package upstream

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
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
	o, err := DecodeObject(raw, func(obj map[string]any) map[string]string {
		return map[string]string{"spec.nodeName": obj["spec"].(map[string]any)["nodeName"].(string)}
	})
	if err != nil {
		t.Fatal(err)
	}
	fs := o.FieldSet()
	if o.Key != "ns/p" || o.RV != 42 || o.Labels["a"] != "b" || fs.Get("spec.nodeName") != "n1" ||
		fs.Get("metadata.name") != "p" || fs.Get("metadata.namespace") != "ns" || string(o.Raw) != string(raw) {
		t.Fatalf("decoded %+v", o)
	}
	// name and namespace are not kept twice: the object answers them.
	if len(o.Fields) != 1 {
		t.Errorf("Fields = %v, want only spec.nodeName", o.Fields)
	}
	for _, bad := range []string{`{`, `{"metadata":{"name":"x","resourceVersion":"abc"}}`, `{"metadata":{"name":"x"}}`} {
		if _, err := DecodeObject([]byte(bad), nil); err == nil {
			t.Errorf("DecodeObject(%s): want error", bad)
		}
	}
}

// A reused numberDecoder decodes a sequence of objects exactly as a fresh
// json.Decoder with UseNumber does, whatever their sizes and trailing
// whitespace.
func TestNumberDecoderReuse(t *testing.T) {
	docs := []string{
		`{"metadata":{"name":"a"},"spec":{"n":9007199254740993}}`,
		"{\"metadata\":{\"name\":\"b\"},\"data\":{\"x\":\"" + strings.Repeat("y", 5000) + "\"}}\n",
		`  {"metadata":{"name":"c"},"spec":{"f":1.5,"b":true,"z":null,"l":[1,"2",{"3":4}]}}  `,
		`{}`,
	}
	nd := newNumberDecoder()
	for round := 0; round < 2; round++ {
		for _, doc := range docs {
			got, err := nd.decode([]byte(doc))
			if err != nil {
				t.Fatalf("decode %q: %v", doc, err)
			}
			var want map[string]any
			dec := json.NewDecoder(strings.NewReader(doc))
			dec.UseNumber()
			if err := dec.Decode(&want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decode %q = %v, want %v", doc, got, want)
			}
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

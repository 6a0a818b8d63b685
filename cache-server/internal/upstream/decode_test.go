package upstream

import (
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
	if o.Key != "ns/p" || o.RV != 42 || o.Labels["a"] != "b" || o.Fields["spec.nodeName"] != "n1" ||
		o.Fields["metadata.name"] != "p" || o.Fields["metadata.namespace"] != "ns" || string(o.Raw) != string(raw) {
		t.Fatalf("decoded %+v", o)
	}
	for _, bad := range []string{`{`, `{"metadata":{"name":"x","resourceVersion":"abc"}}`, `{"metadata":{"name":"x"}}`} {
		if _, err := DecodeObject([]byte(bad), nil); err == nil {
			t.Errorf("DecodeObject(%s): want error", bad)
		}
	}
}

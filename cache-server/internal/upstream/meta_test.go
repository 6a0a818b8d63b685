package upstream

import (
	"encoding/json"
	"reflect"
	"testing"
)

// sameKeyMeta fails t when decodeKeyMeta's answer for raw is not
// json.Unmarshal's.
func sameKeyMeta(t *testing.T, raw []byte) {
	t.Helper()
	var want keyMeta
	werr := json.Unmarshal(raw, &want)
	got, gerr := decodeKeyMeta(raw)
	if (werr != nil) != (gerr != nil) || werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\ndecodeKeyMeta %+v (err %v)\njson.Unmarshal %+v (err %v)", raw, got, gerr, want, werr)
	}
	if werr != nil && gerr.Error() != werr.Error() {
		t.Fatalf("%q: error %q, json.Unmarshal's %q", raw, gerr, werr)
	}
}

var keyMetaCases = []string{
	`{"metadata":{"name":"p","namespace":"ns","resourceVersion":"42","labels":{"a":"b","c":""}}}`,
	`{"metadata":{"name":"p","labels":{}}}`, `{"metadata":{"labels":null}}`, `{"metadata":null}`, `{}`, `null`,
	`{"metadata":{"name":"a"},"metadata":{"namespace":"b"}}`,                      // merged
	`{"metadata":{"labels":{"a":"1"}},"metadata":{"labels":{"b":"2","a":"3"}}}`,   // labels merged
	`{"metadata":{"labels":{"a":"1"},"labels":null}}`,                             // nil again
	`{"Metadata":{"NAME":"x","resourceversion":"7","Labels":{"K":"v"}}}`,          // case-insensitive keys
	`{"metadata":{"name":"a","name":null}}`, `{"metadata":{"labels":{"a":null}}}`, // null keeps / zero
	`{"meta\u0064ata":{"n\u0061me":"\u00e9\n","labels":{"\u0061":"\"b\""}}}`,                // escapes
	"{\"metadata\":{\"name\":\"\xff\",\"labels\":{\"\xfe\":\"x\"}}}",                        // invalid UTF-8
	"{\"metadata\":{\"nameſ\":\"x\",\"ſtatus\":1}}", "{\"metadata\":{\"\u212aind\":\"x\"}}", // non-ASCII keys
	`{"metadata":{"name":5}}`, `{"metadata":{"labels":{"a":1}}}`, `{"metadata":[]}`, `{"metadata":"x"}`,
	`{"metadata":{"labels":[]}}`, `[]`, `{"metadata":{"name":"a"}`, `{"metadata":{"name":"a"}} x`, ``,
	`{"metadata":{"name":"a","namespace":"b","resourceVersion":"1"},"spec":{"metadata":{"name":"inner"}}}`,
}

// decodeKeyMeta answers what json.Unmarshal answers: merges, case,
// escapes, nulls, wrong types and syntax errors (with its error).
func TestDecodeKeyMeta(t *testing.T) {
	for _, c := range keyMetaCases {
		sameKeyMeta(t, []byte(c))
	}
	_, obj, err := eventParts(benchPodEvent(t))
	if err != nil {
		t.Fatal(err)
	}
	sameKeyMeta(t, obj)
	// The bench's Pod takes the fast path.
	var m keyMeta
	if !fastKeyMeta(obj, &m) || m.Metadata.Name != "app-000-000000-000800" || m.Metadata.Labels["tier"] != "worker" {
		t.Errorf("fast path on the bench's Pod: %+v", m)
	}
}

func FuzzDecodeKeyMeta(f *testing.F) {
	for _, c := range keyMetaCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { sameKeyMeta(t, raw) })
}

package upstream

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/fields"
)

// benchPodEvent is a watch event of the Pods hack/bench -mode nodes writes
// (testdata/bench-pod-event.json: 5.2 KiB as kube-apiserver 1.37.1 sent
// it, managedFields and the size padding included).
func benchPodEvent(tb testing.TB) []byte {
	tb.Helper()
	raw, err := os.ReadFile("testdata/bench-pod-event.json")
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// podFields is the ingester's FieldsFunc for pods, as package ingest
// builds it.
func podFields(tb testing.TB) FieldsFunc {
	tb.Helper()
	r, err := fields.New(fields.Spec{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod", Namespaced: true})
	if err != nil {
		tb.Fatal(err)
	}
	return func(raw []byte) map[string]string {
		set, err := r.SetJSON(raw)
		if err != nil {
			tb.Fatal(err)
		}
		return set
	}
}

// BenchmarkDecodePodEvent is the per-update ingestion cost of a Pod before
// the store: the frame's parts, then the object's key, labels and field
// set (Ingester.decode without the pool).
func BenchmarkDecodePodEvent(b *testing.B) {
	frame := benchPodEvent(b)
	fieldsOf := podFields(b)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		_, obj, err := eventParts(frame)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeObject(append([]byte(nil), obj...), fieldsOf); err != nil {
			b.Fatal(err)
		}
	}
}

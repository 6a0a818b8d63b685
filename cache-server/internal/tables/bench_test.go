package tables

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// BenchmarkTable measures the CPU of a Table row: a LIST page of 500
// objects (kubectl get's chunk size) turned into a Table and its JSON body
// per op; ns/row is the figure docs/benchmarks.md reports.
func BenchmarkTable(b *testing.B) {
	const rows = 500
	builtins := NewBuiltins()
	pod := func(i int) []byte { return mustJSON(b, samplePod(fmt.Sprintf("pod-%03d", i))) }
	configMap := func(i int) []byte {
		return mustJSON(b, &corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", i), Namespace: "ns", ResourceVersion: "1", CreationTimestamp: created, Labels: map[string]string{"app": "a"}},
			Data:       map[string]string{"a": strings.Repeat("x", 512), "b": strings.Repeat("y", 400)},
		})
	}
	widget := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"apiVersion":"example.cachetier.io/v1","kind":"Widget","metadata":{"name":"widget-%03d","namespace":"ns","resourceVersion":"1","creationTimestamp":"2020-01-02T03:04:05Z","labels":{"app":"a"}},"spec":{"color":"red","size":%d}}`, i, i))
	}
	widgets := NewCustom(schema.GroupResource{Group: "example.cachetier.io", Resource: "widgets"}, "v1", widgetCRD(
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Color", Type: "string", JSONPath: ".spec.color"},
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
	))
	for _, c := range []struct {
		name    string
		printer Printer
		item    func(int) []byte
	}{
		{"pods", builtins.For(podsGVR, "Pod"), pod},
		{"configmaps-1KiB", builtins.For(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "ConfigMap"), configMap},
		{"widgets-CR", widgets, widget},
	} {
		items := make([][]byte, rows)
		for i := range items {
			items[i] = c.item(i)
		}
		for _, inc := range []metav1.IncludeObjectPolicy{metav1.IncludeMetadata, metav1.IncludeObject} {
			b.Run(c.name+"/"+string(inc), func(b *testing.B) {
				opts := Options{TableOptions: metav1.TableOptions{IncludeObject: inc}, GroupVersion: metav1.SchemeGroupVersion}
				b.ReportAllocs()
				for b.Loop() {
					t, err := c.printer.Table(items, true, metav1.ListMeta{ResourceVersion: "1"}, opts)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := json.Marshal(t); err != nil { // the response body, as the front writes it
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/row")
			})
		}
	}
}

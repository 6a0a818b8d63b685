package front

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestBookmarkObjectAsAPIServer: the bookmark objects are the bytes
// apimachinery's JSON serializer writes for the object kube-apiserver's
// watch cache builds (its storage's New with only resourceVersion and
// the initial-events-end annotation set): a typed object for built-in
// kinds, an Unstructured for custom resources.
func TestBookmarkObjectAsAPIServer(t *testing.T) {
	jsonSerializer := func(t *testing.T, obj runtime.Object) []byte {
		t.Helper()
		info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
		if !ok {
			t.Fatal("no JSON serializer")
		}
		var b bytes.Buffer
		if err := info.Serializer.Encode(obj, &b); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	}
	for _, initialEnd := range []bool{false, true} {
		var annotations map[string]string
		if initialEnd {
			annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1234", Annotations: annotations}}
		want := jsonSerializer(t, cm)
		if got := bookmarkObject("ConfigMap", "v1", false, 1234, initialEnd); !bytes.Equal(got, want) {
			t.Errorf("built-in, initial-events-end %v:\n got %s\nwant %s", initialEnd, got, want)
		}

		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"})
		u.SetResourceVersion("1234")
		if annotations != nil {
			u.SetAnnotations(annotations)
		}
		want = jsonSerializer(t, u)
		if got := bookmarkObject("Certificate", "cert-manager.io/v1", true, 1234, initialEnd); !bytes.Equal(got, want) {
			t.Errorf("custom resource, initial-events-end %v:\n got %s\nwant %s", initialEnd, got, want)
		}
	}
}

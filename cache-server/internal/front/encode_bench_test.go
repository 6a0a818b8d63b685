package front

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	encoding_ "github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
)

// benchConfigMaps returns n stored ConfigMaps of about size bytes each, as
// ingestion stores them (JSON with kind and apiVersion first).
func benchConfigMaps(b *testing.B, n, size int) (*resource, []*store.Object) {
	b.Helper()
	res := &resource{
		Resource:    Resource{Entry: catalog.Entry{}},
		GVR:         schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		APIResource: metav1.APIResource{Name: "configmaps", Kind: "ConfigMap", Namespaced: true},
		protobuf:    encoding_.NewProtobuf(encoding_.DefaultCacheBytes, nil),
	}
	payload := strings.Repeat("x", size)
	objs := make([]*store.Object, n)
	for i := range objs {
		cm := corev1.ConfigMap{
			TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%06d", i), Namespace: "bench", ResourceVersion: fmt.Sprint(1000 + i), UID: "0c3c9f55-4f2a-4d8f-9d5e-6f7f8e9a0b1c", Labels: map[string]string{"app": "bench"}, CreationTimestamp: metav1.Unix(1700000000, 0)},
			Data:       map[string]string{"payload": payload},
		}
		raw, err := json.Marshal(cm)
		if err != nil {
			b.Fatal(err)
		}
		objs[i] = &store.Object{Key: "bench/" + cm.Name, Namespace: "bench", Name: cm.Name, RV: uint64(1000 + i), Raw: raw}
	}
	return res, objs
}

func benchList(b *testing.B, enc encoding, n, size int, warm bool) {
	res, objs := benchConfigMaps(b, n, size)
	meta := metav1.ListMeta{ResourceVersion: "5000"}
	if enc.isProtobuf() && !warm {
		// A cache too small to hold anything: every LIST converts.
		res.protobuf = encoding_.NewProtobuf(0, nil)
	}
	if warm {
		if _, err := encodeList(res, enc, meta, objs); err != nil {
			b.Fatal(err)
		}
	}
	var bytes int
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		body, err := encodeList(res, enc, meta, objs)
		if err != nil {
			b.Fatal(err)
		}
		bytes = len(body)
	}
	b.SetBytes(int64(bytes))
}

// JSON list assembly: a copy of stored bytes.
func BenchmarkListJSON10kx1KiB(b *testing.B) { benchList(b, encJSON, 10000, 1024, false) }
func BenchmarkListJSON300x1MiB(b *testing.B) { benchList(b, encJSON, 300, 1<<20, false) }
func BenchmarkListPartialMetadata10k(b *testing.B) {
	benchList(b, encPartialMetadata, 10000, 1024, false)
}

// Protobuf: cold (every object converted: JSON decode + protobuf encode)
// and warm (per-object messages from the cache, only the list assembled).
func BenchmarkListProtobufCold10kx1KiB(b *testing.B) { benchList(b, encProtobuf, 10000, 1024, false) }
func BenchmarkListProtobufWarm10kx1KiB(b *testing.B) { benchList(b, encProtobuf, 10000, 1024, true) }
func BenchmarkListProtobufCold300x1MiB(b *testing.B) { benchList(b, encProtobuf, 300, 1<<20, false) }
func BenchmarkListProtobufWarm300x1MiB(b *testing.B) { benchList(b, encProtobuf, 300, 1<<20, true) }

// One object, as a GET or a watch event encodes it.
func BenchmarkObjectProtobufCold1KiB(b *testing.B) {
	res, objs := benchConfigMaps(b, 1, 1024)
	p := encoding_.NewProtobuf(0, nil)
	gvk := res.GVR.GroupVersion().WithKind("ConfigMap")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Object(gvk, objs[0]); err != nil {
			b.Fatal(err)
		}
	}
}

// benchWriteList serves a warm LIST in enc through writeList, streamed as
// a response is (compare with benchList's whole bodies of the same list).
func benchWriteList(b *testing.B, enc encoding, accept, query string) {
	res, objs := benchConfigMaps(b, 10000, 1024)
	res.bodies = newBodyWriters()
	res.printer = tables.NewBuiltins().For(res.GVR, "ConfigMap")
	res.tableFailed = func(error) {}
	s := &Server{}
	meta := metav1.ListMeta{ResourceVersion: "5000"}
	r := httptest.NewRequest(http.MethodGet, "/api/v1/configmaps"+query, nil)
	r.Header.Set("Accept", accept)
	serve := func() int {
		w := &discardWriter{h: http.Header{}}
		if code := s.writeList(w, r, res, enc, meta, objs); code != http.StatusOK {
			b.Fatalf("code %d", code)
		}
		return w.n
	}
	n := serve() // warm the protobuf cache
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serve()
	}
	b.SetBytes(int64(n))
}

// discardWriter is a ResponseWriter that counts and drops the body.
type discardWriter struct {
	h http.Header
	n int
}

func (d *discardWriter) Header() http.Header { return d.h }
func (d *discardWriter) WriteHeader(int)     {}
func (d *discardWriter) Write(p []byte) (int, error) {
	d.n += len(p)
	return len(p), nil
}

func BenchmarkWriteListProtobufWarm10kx1KiB(b *testing.B) {
	benchWriteList(b, encProtobuf, encoding_.ProtobufMediaType, "")
}

func BenchmarkWriteListProtobufMetadataWarm10k(b *testing.B) {
	benchWriteList(b, encProtobufPartialMetadata, encoding_.ProtobufMediaType+";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1", "")
}

func BenchmarkWriteListPartialMetadata10k(b *testing.B) {
	benchWriteList(b, encPartialMetadata, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1", "")
}

func BenchmarkWriteListTable10k(b *testing.B) {
	benchWriteList(b, encTable, "application/json;as=Table;v=v1;g=meta.k8s.io", "")
}

func BenchmarkWriteListTableObject10k(b *testing.B) {
	benchWriteList(b, encTable, "application/json;as=Table;v=v1;g=meta.k8s.io", "?includeObject=Object")
}

// The same Tables built whole (encodeTable), as before writeList streamed
// them.
func benchWholeTable(b *testing.B, query string) {
	res, objs := benchConfigMaps(b, 10000, 1024)
	res.printer = tables.NewBuiltins().For(res.GVR, "ConfigMap")
	res.tableFailed = func(error) {}
	r := httptest.NewRequest(http.MethodGet, "/api/v1/configmaps"+query, nil)
	r.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	opts, err := tableOptions(r)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := res.encodeTable(opts, objs, true, metav1.ListMeta{ResourceVersion: "5000"}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListTableWhole10k(b *testing.B)       { benchWholeTable(b, "") }
func BenchmarkListTableObjectWhole10k(b *testing.B) { benchWholeTable(b, "?includeObject=Object") }

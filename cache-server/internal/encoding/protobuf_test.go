package encoding

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

func testPod(i int) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("pod-%03d", i), Namespace: "ns", ResourceVersion: fmt.Sprint(100 + i),
			UID: "uid", Labels: map[string]string{"b": "2", "a": "1"}, CreationTimestamp: metav1.Unix(1700000000, 0),
			Annotations: map[string]string{"x": strings.Repeat("y", i)},
		},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "img",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": resourceMust("100m")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: ptrTime(metav1.Unix(1700000001, 0))},
	}
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }

func storeObj(t testing.TB, obj any, key string) *store.Object {
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &store.Object{Key: key, Raw: raw}
}

// serializer is what the apiserver and client-go use.
var serializer = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

func TestObjectAndEnvelopeMatchSerializer(t *testing.T) {
	p := NewProtobuf(1<<20, nil)
	pod := testPod(1)
	o := storeObj(t, pod, "/ns/pod-001")
	msg, err := p.Object(podGVK, o)
	if err != nil {
		t.Fatal(err)
	}
	got := Envelope("v1", "Pod", msg)
	var want bytes.Buffer
	if err := serializer.Encode(pod, &want); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("envelope differs\n got %q\nwant %q", got, want.Bytes())
	}
	// Cached: the same bytes, without converting again.
	again, _ := p.Object(podGVK, o)
	if &again[0] != &msg[0] {
		t.Fatal("second conversion was not served from the cache")
	}
}

func TestListMatchesSerializer(t *testing.T) {
	p := NewProtobuf(1<<20, nil)
	rem := int64(7)
	meta := metav1.ListMeta{ResourceVersion: "123", Continue: "tok", RemainingItemCount: &rem}
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, ListMeta: meta}
	var items [][]byte
	for i := range 5 {
		pod := testPod(i)
		list.Items = append(list.Items, *pod)
		b, err := p.Object(podGVK, storeObj(t, pod, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, b)
	}
	mb, err := meta.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got := List("v1", "PodList", mb, items, ListMetaFirst)
	var want bytes.Buffer
	if err := serializer.Encode(list, &want); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("list differs\n got %q\nwant %q", got, want.Bytes())
	}
	// And an empty list.
	empty := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, ListMeta: metav1.ListMeta{ResourceVersion: "5"}}
	mb, _ = empty.ListMeta.Marshal()
	want.Reset()
	_ = serializer.Encode(empty, &want)
	if got := List("v1", "PodList", mb, nil, ListMetaFirst); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("empty list differs\n got %q\nwant %q", got, want.Bytes())
	}
}

func TestMetadataList(t *testing.T) {
	p := NewProtobuf(1<<20, nil)
	pod := testPod(3)
	md, err := p.Metadata(storeObj(t, pod, "k"))
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := (&metav1.ListMeta{ResourceVersion: "9"}).Marshal()
	body := List("meta.k8s.io/v1", "PartialObjectMetadataList", mb, [][]byte{md}, ListMetaFirst)
	obj, _, err := serializer.Decode(body, nil, &metav1.PartialObjectMetadataList{})
	if err != nil {
		t.Fatal(err)
	}
	l := obj.(*metav1.PartialObjectMetadataList)
	if l.ResourceVersion != "9" || len(l.Items) != 1 || !equality.Semantic.DeepEqual(l.Items[0].ObjectMeta, pod.ObjectMeta) {
		t.Fatalf("decoded %+v", l)
	}
}

// TestMetadataListsMatchSerializer: the PartialObjectMetadataList of both
// versions byte for byte as the apiserver's serializer writes it —
// meta.k8s.io/v1beta1's numbers its items 1 and its metadata 2, so its
// metadata comes after the items.
func TestMetadataListsMatchSerializer(t *testing.T) {
	p := NewProtobuf(1<<20, nil)
	rem := int64(3)
	for _, meta := range []metav1.ListMeta{{ResourceVersion: "9", Continue: "tok", RemainingItemCount: &rem}, {ResourceVersion: "5"}} {
		for _, n := range []int{0, 1, 4} {
			v1 := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"}, ListMeta: meta}
			v1beta1 := &metav1beta1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1beta1"}, ListMeta: meta}
			var msgs [][]byte
			for i := range n {
				pod := testPod(i)
				md, err := p.Metadata(storeObj(t, pod, fmt.Sprint(i)))
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, md)
				item := metav1.PartialObjectMetadata{ObjectMeta: pod.ObjectMeta}
				v1.Items = append(v1.Items, item)
				v1beta1.Items = append(v1beta1.Items, item)
			}
			mb, err := meta.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				obj        kruntime.Object
				apiVersion string
				f          ListFormat
			}{{v1, "meta.k8s.io/v1", ListMetaFirst}, {v1beta1, "meta.k8s.io/v1beta1", ListItemsFirst}} {
				var want bytes.Buffer
				if err := serializer.Encode(c.obj, &want); err != nil {
					t.Fatal(err)
				}
				if got := List(c.apiVersion, "PartialObjectMetadataList", mb, msgs, c.f); !bytes.Equal(got, want.Bytes()) {
					t.Fatalf("%s, %d items: list differs\n got %q\nwant %q", c.apiVersion, n, got, want.Bytes())
				}
			}
		}
	}
}

func TestStatus(t *testing.T) {
	st := metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound, Message: "x not found",
		Details: &metav1.StatusDetails{Name: "x", Kind: "pods"}}
	full := st
	full.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	var want bytes.Buffer
	if err := serializer.Encode(&full, &want); err != nil {
		t.Fatal(err)
	}
	if got := Status(st); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("status differs\n got %q\nwant %q", got, want.Bytes())
	}
}

// TestWatchFrameDecodesWithClientGo decodes frames the way client-go's
// watch does for a protobuf stream.
func TestWatchFrameDecodesWithClientGo(t *testing.T) {
	p := NewProtobuf(1<<20, nil)
	var stream bytes.Buffer
	for i := range 3 {
		msg, err := p.Object(podGVK, storeObj(t, testPod(i), fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		stream.Write(WatchFrame("ADDED", Envelope("v1", "Pod", msg)))
	}
	var info *kruntime.StreamSerializerInfo
	for _, s := range scheme.Codecs.SupportedMediaTypes() {
		if s.MediaType == ProtobufMediaType {
			info = s.StreamSerializer
		}
	}
	if info == nil {
		t.Fatal("no protobuf stream serializer")
	}
	fr := info.Framer.NewFrameReader(io.NopCloser(&stream))
	dec := restclientwatch.NewDecoder(streaming.NewDecoder(fr, info.Serializer), serializer)
	for i := range 3 {
		typ, obj, err := dec.Decode()
		if err != nil {
			t.Fatal(err)
		}
		pod, ok := obj.(*corev1.Pod)
		if typ != watch.Added || !ok || pod.Name != testPod(i).Name || pod.Spec.NodeName != "node-1" {
			t.Fatalf("event %d: %s %#v", i, typ, obj)
		}
	}
}

func resourceMust(s string) resource.Quantity { return resource.MustParse(s) }

// TestCacheBounded: the cache never holds more than its budget, and entries
// go away with their objects.
func TestCacheBounded(t *testing.T) {
	p := NewProtobuf(4<<10, nil)
	var keep []*store.Object
	for i := range 200 {
		o := storeObj(t, testPod(i%50), fmt.Sprint(i))
		keep = append(keep, o)
		if _, err := p.Object(podGVK, o); err != nil {
			t.Fatal(err)
		}
		if _, n := p.CacheStats(); n > 4<<10 {
			t.Fatalf("cache holds %d bytes, budget %d", n, 4<<10)
		}
	}
	if n, _ := p.CacheStats(); n == 0 || n == 200 {
		t.Fatalf("%d entries: expected eviction down to the budget", n)
	}
	keep = nil
	for range 50 {
		runtime.GC()
		if n, _ := p.CacheStats(); n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	n, _ := p.CacheStats()
	t.Fatalf("%d entries left after their objects were collected", n)
}

// The three-part frame is byte for byte the built one, for message sizes
// around the varint length boundaries.
func TestWatchObjectFrameMatchesWatchFrame(t *testing.T) {
	for _, n := range []int{0, 1, 100, 127, 128, 16383, 16384, 600 << 10} {
		msg := bytes.Repeat([]byte{0x5a}, n)
		for _, typ := range []string{"ADDED", "MODIFIED", "DELETED"} {
			head, tail := WatchObjectFrame(typ, "v1", "Secret", len(msg))
			got := append(append(append([]byte(nil), head...), msg...), tail...)
			want := WatchFrame(typ, Envelope("v1", "Secret", msg))
			if !bytes.Equal(got, want) {
				t.Fatalf("%s, %d-byte message: three-part frame differs from WatchFrame", typ, n)
			}
		}
	}
}

// TestPathsAndLargeMessages: small messages are converted by the plan once
// and then cached; large ones are converted on every use (streamed from the
// JSON by WriteMessage once their size is known) and never cached; JSON the plan refuses goes the
// typed way with the typed path's answer. Every path is counted.
func TestPathsAndLargeMessages(t *testing.T) {
	counts := map[string]int{}
	p := NewProtobuf(64<<20, func(path string) { counts[path]++ })
	secretGVK := schema.GroupVersionKind{Version: "v1", Kind: "Secret"}
	big := &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "ns"},
		Data:       map[string][]byte{"blob": bytes.Repeat([]byte{1, 2, 3}, LargeMessageBytes)}}
	o := storeObj(t, big, "/ns/big")
	want, err := big.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	frame := func(n int) (head, tail []byte) { return WatchObjectFrame("ADDED", "v1", "Secret", n) }
	head, tail := frame(len(want))
	wantFrame := append(append(append([]byte(nil), head...), want...), tail...)
	for range 3 {
		var w bytes.Buffer
		if err := p.WriteMessage(&w, secretGVK, o, false, frame); err != nil || !bytes.Equal(w.Bytes(), wantFrame) {
			t.Fatalf("WriteMessage: %v, equal %v", err, bytes.Equal(w.Bytes(), wantFrame))
		}
		got, err := p.Object(secretGVK, o)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("Object: %v, equal %v", err, bytes.Equal(got, want))
		}
	}
	// Only the message's size is kept (after the first WriteMessage).
	if n, size := p.CacheStats(); n != 1 || size > 1<<10 || counts[PathPlan] != 6 {
		t.Fatalf("large message: %d cache entries of %d bytes, paths %v; want its size only, 6 plan conversions", n, size, counts)
	}

	small := storeObj(t, testPod(3), "/ns/pod-003")
	for range 3 {
		var w, wm bytes.Buffer
		none := func(int) (head, tail []byte) { return nil, nil }
		if err := p.WriteMessage(&w, podGVK, small, false, none); err != nil {
			t.Fatal(err)
		}
		if err := p.WriteMessage(&wm, podGVK, small, true, none); err != nil || wm.Len() == 0 {
			t.Fatal(err)
		}
		if obj, _ := p.Object(podGVK, small); !bytes.Equal(obj, w.Bytes()) {
			t.Fatal("Object and WriteMessage differ")
		}
	}
	if n, _ := p.CacheStats(); n != 3 || counts[PathPlan] != 8 || counts[PathCached] != 7 {
		t.Fatalf("small message: %d cache entries, paths %v; want 2 cached, 2 more plan conversions, 7 hits", n, counts)
	}
	// The cache holds its objects weakly: had the large message's object
	// died before the count above, a collection would have dropped its
	// size entry with it (as the cache should), and the count would be 2.
	runtime.KeepAlive(o)

	// A duplicate member: the plan refuses, the typed decoder takes the
	// last value.
	dup := &store.Object{Key: "/ns/dup", Raw: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","name":"b"}}`)}
	msg, err := p.Object(podGVK, dup)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := pod.Unmarshal(msg); err != nil || pod.Name != "b" || counts[PathTyped] != 1 {
		t.Fatalf("typed fallback: %v, name %q, paths %v", err, pod.Name, counts)
	}
	if _, err := p.Object(podGVK, &store.Object{Key: "/ns/bad", Raw: []byte(`{"apiVersion":"v1","kind":"Pod","spec":{"priority":"high"}}`)}); err == nil {
		t.Fatal("JSON the type does not accept converted without error")
	}
}

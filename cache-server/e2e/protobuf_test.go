package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// The protobuf cases: the same requests with a protobuf Accept header, both
// answers decoded with client-go's protobuf serializer and compared as typed
// objects (items, keys, RVs, ListMeta), following each side's continue
// tokens.

const pbMediaType = "application/vnd.kubernetes.protobuf"

var pbSerializer = func() *protobuf.Serializer {
	// client-go's scheme plus meta.k8s.io/v1 and v1beta1
	// (PartialObjectMetadata).
	s := runtime.NewScheme()
	if err := scheme.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddMetaToScheme(s)
	if err := metav1beta1.AddMetaToScheme(s); err != nil {
		panic(err)
	}
	return protobuf.NewSerializer(s, s)
}()

// pbAnswer is one decoded answer.
type pbAnswer struct {
	code        int
	contentType string
	obj         runtime.Object // decoded body when protobuf
	body        []byte
	retryAfter  string
}

func pbGet(t *testing.T, cfg *rest.Config, path string, q url.Values, accept string) pbAnswer {
	t.Helper()
	r := get(t, cfg, path, q, accept)
	a := pbAnswer{code: r.code, body: r.body, retryAfter: r.retryAfter, contentType: r.contentType}
	if a.contentType == pbMediaType {
		obj, _, err := pbSerializer.Decode(r.body, nil, nil)
		if err != nil {
			t.Fatalf("GET %s: undecodable protobuf answer: %v\n%q", path, err, r.body)
		}
		a.obj = obj
	}
	return a
}

// pbStatusView is the comparable part of a protobuf or JSON error.
func pbStatusView(t *testing.T, a pbAnswer) string {
	t.Helper()
	if a.contentType == pbMediaType {
		st, ok := a.obj.(*metav1.Status)
		if !ok {
			return fmt.Sprintf("non-Status protobuf %T", a.obj)
		}
		return fmt.Sprintf("protobuf %d %s %q", st.Code, st.Reason, digits.ReplaceAllString(st.Message, "N"))
	}
	return "json " + statusView(t, a.body)
}

// pbCompare sends the same request to both and compares; for lists it
// returns both continue tokens.
func pbCompare(t *testing.T, path string, wq, gq url.Values, accept string) (wantCont, gotCont string) {
	t.Helper()
	want := pbGet(t, testEnv.admin, path, wq, accept)
	got := pbGet(t, testEnv.tierAdmin, path, gq, accept)
	if want.code != got.code || want.contentType != got.contentType {
		t.Fatalf("%s?%s: %d %s from tier, %d %s from apiserver\n tier: %q\n apiserver: %q", path, gq.Encode(), got.code, got.contentType, want.code, want.contentType, got.body, want.body)
	}
	if want.code != http.StatusOK {
		if w, g := pbStatusView(t, want), pbStatusView(t, got); w != g {
			t.Fatalf("%s?%s: error differs\n tier:      %s\n apiserver: %s", path, gq.Encode(), g, w)
		}
		if want.retryAfter != got.retryAfter {
			t.Fatalf("Retry-After %q from tier, %q from apiserver", got.retryAfter, want.retryAfter)
		}
		return "", ""
	}
	if want.contentType != pbMediaType {
		// JSON fallback (custom resources): same items.
		var wl, gl listView
		_ = jsonUnmarshal(want.body, &wl)
		if err := jsonUnmarshal(got.body, &gl); err != nil {
			t.Fatalf("tier body: %v", err)
		}
		if w, g := strings.Join(wl.keys(), "\n"), strings.Join(gl.keys(), "\n"); w != g || wl.Kind != gl.Kind {
			t.Fatalf("JSON fallback differs\n tier: %s %s\n apiserver: %s %s", gl.Kind, g, wl.Kind, w)
		}
		return wl.Metadata.Continue, gl.Metadata.Continue
	}
	if fmt.Sprintf("%T", want.obj) != fmt.Sprintf("%T", got.obj) {
		t.Fatalf("%s: %T from tier, %T from apiserver", path, got.obj, want.obj)
	}
	if !meta.IsListType(want.obj) {
		if !equality.Semantic.DeepEqual(want.obj, got.obj) {
			t.Fatalf("%s: object differs\n tier:      %#v\n apiserver: %#v", path, got.obj, want.obj)
		}
		return "", ""
	}
	wItems, _ := meta.ExtractList(want.obj)
	gItems, _ := meta.ExtractList(got.obj)
	if w, g := pbKeys(wItems), pbKeys(gItems); w != g {
		t.Fatalf("%s?%s: items differ\n tier (%d):\n%s\n apiserver (%d):\n%s", path, gq.Encode(), len(gItems), g, len(wItems), w)
	}
	for i := range wItems {
		if !equality.Semantic.DeepEqual(wItems[i], gItems[i]) {
			t.Fatalf("%s: item %d differs\n tier:      %#v\n apiserver: %#v", path, i, gItems[i], wItems[i])
		}
	}
	wl, _ := meta.ListAccessor(want.obj)
	gl, _ := meta.ListAccessor(got.obj)
	if (wl.GetContinue() == "") != (gl.GetContinue() == "") {
		t.Fatalf("%s: continue %q from tier, %q from apiserver", path, gl.GetContinue(), wl.GetContinue())
	}
	if fmt.Sprint(deref(wl.GetRemainingItemCount())) != fmt.Sprint(deref(gl.GetRemainingItemCount())) {
		t.Fatalf("%s: remainingItemCount %v from tier, %v from apiserver", path, deref(gl.GetRemainingItemCount()), deref(wl.GetRemainingItemCount()))
	}
	if gl.GetResourceVersion() == "" {
		t.Fatalf("%s: tier list has no resourceVersion", path)
	}
	if wq.Get("resourceVersionMatch") == "Exact" && wl.GetResourceVersion() != gl.GetResourceVersion() {
		t.Fatalf("%s: Exact list at RV %s from tier, %s from apiserver", path, gl.GetResourceVersion(), wl.GetResourceVersion())
	}
	return wl.GetContinue(), gl.GetContinue()
}

func pbKeys(items []runtime.Object) string {
	var out []string
	for _, it := range items {
		m, err := meta.Accessor(it)
		if err != nil {
			out = append(out, fmt.Sprintf("%T", it))
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s@%s", m.GetNamespace(), m.GetName(), m.GetResourceVersion()))
	}
	return strings.Join(out, "\n")
}

func pbCompareList(t *testing.T, path string, q url.Values, accept string) {
	t.Helper()
	wc, gc := pbCompare(t, path, q, q, accept)
	for page := 1; wc != "" && page < 1000; page++ {
		wq, gq := url.Values{}, url.Values{}
		for k, v := range q {
			if k != "resourceVersion" && k != "resourceVersionMatch" {
				wq[k], gq[k] = v, v
			}
		}
		wq.Set("continue", wc)
		gq.Set("continue", gc)
		wc, gc = pbCompare(t, path, wq, gq, accept)
	}
}

var pbAccepts = []string{
	pbMediaType,
	pbMediaType + ", application/json",
	pbMediaType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1," + pbMediaType + ",application/json",
}

// TestProtobufListMatchesAPIServer: LISTs of built-in and custom resources
// with protobuf Accept headers.
func TestProtobufListMatchesAPIServer(t *testing.T) { forEachTier(t, testProtobufListMatchesAPIServer) }

func testProtobufListMatchesAPIServer(t *testing.T) {
	rv := currentRV(t)
	targets := []struct {
		path, label, field string
	}{
		{"/api/v1/configmaps", "", ""},
		{"/api/v1/namespaces/ns-1/configmaps", "app!=a", ""},
		{"/api/v1/pods", "", ""},
		{"/api/v1/pods", "", "spec.nodeName=node-1"},
		{"/api/v1/secrets", "", "type=Opaque"},
		{"/api/v1/events", "", ""},
		{"/api/v1/namespaces", "", ""},
		{"/apis/example.cachetier.io/v1/widgets", "", ""},
		{"/apis/example.cachetier.io/v1/namespaces/ns-2/widgets", "app=a", ""},
	}
	n := 0
	for _, tg := range targets {
		for _, accept := range pbAccepts {
			for _, r := range [][2]string{{"", ""}, {"0", ""}, {rv, "Exact"}, {rv, "NotOlderThan"}} {
				for _, limit := range []string{"", "1", "7", "500"} {
					q := query("resourceVersion", r[0], "resourceVersionMatch", r[1], "limit", limit, "labelSelector", tg.label, "fieldSelector", tg.field)
					t.Run(accept+" "+tg.path+"?"+q.Encode(), func(t *testing.T) { pbCompareList(t, tg.path, q, accept) })
					n++
				}
			}
		}
	}
	// meta.k8s.io/v1beta1's PartialObjectMetadataList numbers its fields
	// the other way round (items 1, metadata 2).
	for _, tg := range targets {
		for _, limit := range []string{"", "7"} {
			accept := pbMediaType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1"
			q := query("limit", limit, "labelSelector", tg.label, "fieldSelector", tg.field)
			t.Run(accept+" "+tg.path+"?"+q.Encode(), func(t *testing.T) { pbCompareList(t, tg.path, q, accept) })
			n++
		}
	}
	t.Logf("compared %d protobuf LIST requests", n)
}

// TestProtobufGetMatchesAPIServer: GETs, errors included (a protobuf client
// gets a protobuf Status), and the answers to protobuf forms the apiserver
// does not serve: custom resources, Tables, mismatched metadata forms.
func TestProtobufGetMatchesAPIServer(t *testing.T) { forEachTier(t, testProtobufGetMatchesAPIServer) }

func testProtobufGetMatchesAPIServer(t *testing.T) {
	paths := []string{
		"/api/v1/namespaces/ns-1/configmaps/cm-001",
		"/api/v1/namespaces/ns-1/configmaps/does-not-exist",
		"/api/v1/namespaces/ns-3/pods/pod-02",
		"/api/v1/namespaces/ns-2",
		"/api/v1/namespaces/nope",
		"/apis/example.cachetier.io/v1/namespaces/ns-0/widgets/widget-01",
		"/apis/example.cachetier.io/v1/namespaces/ns-0/widgets/nope",
	}
	accepts := []string{
		pbMediaType,
		pbMediaType + ", application/json",
		pbMediaType + ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
		pbMediaType + ";as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
		pbMediaType + ";as=Table;g=meta.k8s.io;v=v1",
	}
	for _, p := range paths {
		for _, accept := range accepts {
			for _, r := range []string{"", "0", "abc"} {
				q := query("resourceVersion", r)
				t.Run(accept+" "+p+"?"+q.Encode(), func(t *testing.T) { pbCompare(t, p, q, q, accept) })
			}
		}
	}
	for _, p := range []string{"/api/v1/configmaps", "/apis/example.cachetier.io/v1/widgets"} {
		for _, accept := range []string{pbMediaType + ";as=Table;g=meta.k8s.io;v=v1", pbMediaType + ";as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"} {
			t.Run(accept+" "+p, func(t *testing.T) { pbCompare(t, p, nil, nil, accept) })
		}
	}
	// Malformed parameters get the same protobuf Status.
	for _, q := range []url.Values{query("resourceVersion", "abc", "limit", "5"), query("resourceVersionMatch", "Exact"), query("limit", "-1"), query("labelSelector", "a b")} {
		t.Run("errors "+q.Encode(), func(t *testing.T) { pbCompare(t, "/api/v1/configmaps", q, q, pbMediaType) })
	}
}

// TestProtobufTypedClient lists pods through the tier with a client-go
// typed clientset speaking protobuf, paginated and not, and gets the
// apiserver's objects.
func TestProtobufTypedClient(t *testing.T) { forEachTier(t, testProtobufTypedClient) }

func testProtobufTypedClient(t *testing.T) {
	ctx := context.Background()
	clients := map[string]kubernetes.Interface{}
	for name, cfg := range map[string]*rest.Config{"apiserver": testEnv.admin, "tier": testEnv.tierAdmin} {
		c := rest.CopyConfig(cfg)
		c.ContentType = pbMediaType
		c.AcceptContentTypes = pbMediaType
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		clients[name] = cs
	}
	for _, opts := range []metav1.ListOptions{{}, {Limit: 3}} {
		var all [2][]string
		for i, name := range []string{"apiserver", "tier"} {
			opts := opts
			for {
				l, err := clients[name].CoreV1().Pods("").List(ctx, opts)
				if err != nil {
					t.Fatalf("%s: list pods over protobuf: %v", name, err)
				}
				for _, p := range l.Items {
					if p.Spec.NodeName == "" && len(p.Spec.Containers) == 0 {
						t.Fatalf("%s: pod %s decoded without spec", name, p.Name)
					}
					all[i] = append(all[i], p.Namespace+"/"+p.Name+"@"+p.ResourceVersion)
				}
				if l.Continue == "" {
					break
				}
				opts.Continue = l.Continue
			}
		}
		if w, g := strings.Join(all[0], " "), strings.Join(all[1], " "); w != g || w == "" {
			t.Fatalf("limit %d: pods differ\n tier:      %s\n apiserver: %s", opts.Limit, g, w)
		}
	}
	pod, err := clients["tier"].CoreV1().Pods("ns-3").Get(ctx, "pod-02", metav1.GetOptions{})
	if err != nil || pod.Name != "pod-02" {
		t.Fatalf("get over protobuf: %v %v", pod, err)
	}
	if _, err := clients["tier"].CoreV1().Pods("ns-3").Get(ctx, "nope", metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("get of a missing pod over protobuf: %v", err)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

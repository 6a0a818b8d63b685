package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/rest"
	"k8s.io/kube-openapi/pkg/aggregator"
	"k8s.io/kube-openapi/pkg/handler3"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/sampledata"
)

// One control plane for the package's tests.
var admin *rest.Config

func TestMain(m *testing.M) {
	cp, err := controlplane.Start(context.Background(), controlplane.Options{ServiceClusterIPRange: "127.0.215.0/24"})
	if err != nil {
		os.Stderr.WriteString("openapi tests: " + err.Error() + "\n")
		os.Exit(1)
	}
	if admin, err = cp.RESTConfig(); err != nil {
		os.Stderr.WriteString("openapi tests: " + err.Error() + "\n")
		os.Exit(1)
	}
	code := m.Run()
	_ = cp.Stop()
	os.Exit(code)
}

const testGroup = "openapi.test.cachetier.io"

// createCRD creates (or replaces the schema of) gadgets.<testGroup> with
// the given spec properties and waits until it is established.
func createCRD(t *testing.T, name string, props ...string) {
	t.Helper()
	ctx := context.Background()
	c := apiextensionsclient.NewForConfigOrDie(admin)
	p := map[string]apiextensionsv1.JSONSchemaProps{}
	for _, n := range props {
		p[n] = apiextensionsv1.JSONSchemaProps{Type: "string", Description: "the " + n}
	}
	plural := strings.ToLower(name) + "s"
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + testGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: testGroup, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: strings.ToLower(name), Kind: name, ListKind: name + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: p}},
				}},
			}},
		},
	}
	old, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
	if err == nil {
		old.Spec = crd.Spec
		_, err = c.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, old, metav1.UpdateOptions{})
	} else {
		_, err = c.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	err = sampledata.WaitEstablished(ctx, c, crd.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The apiserver publishes the group-version's OpenAPI after the CRD is
	// established, v3 and v2 separately and, for an update, possibly in
	// more than one step: wait until both documents describe every
	// property and have stayed the same for a second, so a test's
	// "nothing changed" poll does not meet the tail of the publication.
	gv := "apis/" + testGroup + "/v1"
	var last string
	stableSince := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, disc := upstreamGet(t, "/openapi/v3", mediaJSON)
		url := discoveryOf(t, disc)[gv]
		if url == "" {
			return false, nil
		}
		_, v3 := upstreamGet(t, url, mediaJSON)
		v2resp, v2 := upstreamGet(t, "/openapi/v2", mediaJSON)
		for _, n := range props {
			if !bytes.Contains(v3, []byte(`"the `+n+`"`)) || !bytes.Contains(v2, []byte(`"the `+n+`"`)) {
				return false, nil
			}
		}
		state := url + " " + v2resp.Header.Get("Etag")
		if state != last {
			last, stableSince = state, time.Now()
		}
		return time.Since(stableSince) >= time.Second, nil
	})
	if err != nil {
		t.Fatalf("the apiserver never published a settled OpenAPI for %s with %v: %v", gv, props, err)
	}
}

// countingConfig is admin with every request counted.
func countingConfig(n *atomic.Int64) *rest.Config {
	cfg := rest.CopyConfig(admin)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			n.Add(1)
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type testKeeper struct {
	*Keeper
	requests  atomic.Int64
	refreshes *prometheus.CounterVec
}

func newTestKeeper(t *testing.T, served ...schema.GroupVersion) *testKeeper {
	t.Helper()
	tk := &testKeeper{refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"result"})}
	k, err := New(Options{
		Upstream: countingConfig(&tk.requests), Served: served, Group: "p.cache.cachetier.io", Version: "v1alpha1",
		Refreshes: tk.refreshes, LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "l"}), Log: testr.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	tk.Keeper = k
	if err := k.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tk
}

// served is what the keeper answers a request for path from user (the
// request came under prefix, "" at the root).
func (tk *testKeeper) served(method, path, accept, prefix, userName string, header ...string) *http.Response {
	r := httptest.NewRequest(method, path, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	r = r.WithContext(request.WithUser(r.Context(), &user.DefaultInfo{Name: userName, Groups: []string{user.AllAuthenticated}}))
	w := httptest.NewRecorder()
	p := r.URL.Path
	tk.ServeOpenAPI(w, r, strings.TrimPrefix(p, prefix), prefix)
	return w.Result()
}

// upstreamGet is the apiserver's own answer.
func upstreamGet(t *testing.T, path, accept string) (*http.Response, []byte) {
	t.Helper()
	c, err := rest.HTTPClientFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, admin.Host+path, nil)
	req.Header.Set("Accept", accept)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upstream GET %s: %s", path, resp.Status)
	}
	return resp, body
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func discoveryOf(t *testing.T, body []byte) map[string]string {
	t.Helper()
	var d handler3.OpenAPIV3Discovery
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("discovery is not JSON: %v\n%s", err, body)
	}
	out := map[string]string{}
	for k, v := range d.Paths {
		out[k] = v.ServerRelativeURL
	}
	return out
}

var (
	coreV1  = schema.GroupVersion{Version: "v1"}
	widgets = schema.GroupVersion{Group: testGroup, Version: "v1"}
)

// TestServesTheUpstreamsDocuments: the documents kubectl reads are the
// apiserver's, byte for byte, with its ETags; v3 discovery lists the
// served paths only, at the apiserver's hashes.
func TestServesTheUpstreamsDocuments(t *testing.T) {
	createCRD(t, "Gadget", "color")
	tk := newTestKeeper(t, coreV1, widgets)

	for _, accept := range []string{mediaJSON, mediaV2ProtoAccept} {
		want, wantBody := upstreamGet(t, "/openapi/v2", accept)
		got := tk.served(http.MethodGet, "/openapi/v2", accept, "", "alice")
		if body := readAll(t, got); got.StatusCode != 200 || !bytes.Equal(body, wantBody) {
			t.Fatalf("/openapi/v2 (%s): %d, %d bytes; the apiserver's is %d bytes", accept, got.StatusCode, len(body), len(wantBody))
		}
		for _, h := range []string{"Content-Type", "Etag"} {
			if got.Header.Get(h) != want.Header.Get(h) {
				t.Errorf("/openapi/v2 (%s) %s: %q, the apiserver's %q", accept, h, got.Header.Get(h), want.Header.Get(h))
			}
		}
		// A client holding the document gets 304.
		if r := tk.served(http.MethodGet, "/openapi/v2", accept, "", "alice", "If-None-Match", want.Header.Get("Etag")); r.StatusCode != http.StatusNotModified {
			t.Errorf("/openapi/v2 with If-None-Match: %d, want 304", r.StatusCode)
		}
	}

	_, upDisc := upstreamGet(t, "/openapi/v3", mediaJSON)
	up := discoveryOf(t, upDisc)
	got := discoveryOf(t, readAll(t, tk.served(http.MethodGet, "/openapi/v3", "", "", "alice")))
	// (The apiserver lists no apis/<group> document for CRD groups.)
	wantKeys := []string{"api", "api/v1", "apis", "apis/" + testGroup + "/v1"}
	if keys := slices.Sorted(maps.Keys(got)); strings.Join(keys, ",") != strings.Join(wantKeys, ",") {
		t.Fatalf("/openapi/v3 lists %v, want %v", keys, wantKeys)
	}
	for p, u := range got {
		if u != up[p] {
			t.Errorf("/openapi/v3 %s: %s, the apiserver's %s", p, u, up[p])
		}
		for _, accept := range []string{mediaJSON, mediaV3ProtoAccept} {
			want, wantBody := upstreamGet(t, u, accept)
			r := tk.served(http.MethodGet, u, accept, "", "alice")
			if body := readAll(t, r); r.StatusCode != 200 || !bytes.Equal(body, wantBody) {
				t.Fatalf("%s (%s): %d, %d bytes; the apiserver's is %d bytes", u, accept, r.StatusCode, len(body), len(wantBody))
			}
			for _, h := range []string{"Content-Type", "Etag", "Cache-Control", "Vary"} {
				if r.Header.Get(h) != want.Header.Get(h) {
					t.Errorf("%s (%s) %s: %q, the apiserver's %q", u, accept, h, r.Header.Get(h), want.Header.Get(h))
				}
			}
		}
	}
	// Below the prefix the same documents; an outdated hash is redirected
	// below the prefix too.
	const prefix = "/apis/p.cache.cachetier.io/v1alpha1"
	r := tk.served(http.MethodGet, prefix+"/openapi/v3/api/v1?hash=0BSOLETE", mediaJSON, prefix, "alice")
	if want := prefix + got["api/v1"]; r.StatusCode != http.StatusMovedPermanently || r.Header.Get("Location") != want {
		t.Errorf("outdated hash: %d Location %q, want 301 to %q", r.StatusCode, r.Header.Get("Location"), want)
	}
	for _, p := range []string{"/openapi/v3/apis/apps/v1", "/openapi/v3/apis/p.cache.cachetier.io/v1alpha1", "/openapi/v4"} {
		if r := tk.served(http.MethodGet, prefix+p, mediaJSON, prefix, "alice"); r.StatusCode != http.StatusNotFound {
			t.Errorf("%s below the prefix: %d, want 404 (not served)", p, r.StatusCode)
		}
	}
	if r := tk.served(http.MethodGet, "/openapi/v2", "text/html", "", "alice"); r.StatusCode != http.StatusNotAcceptable {
		t.Errorf("/openapi/v2 as text/html: %d, want 406", r.StatusCode)
	}
}

// TestRefreshFollowsCRDChanges: a poll with nothing changed is two small
// requests; a CRD schema change is downloaded by the next poll.
func TestRefreshFollowsCRDChanges(t *testing.T) {
	createCRD(t, "Doohickey", "size")
	tk := newTestKeeper(t, coreV1, widgets)
	before := tk.requests.Load()
	if err := tk.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := tk.requests.Load() - before; n != 2 {
		t.Errorf("a poll without changes made %d requests, want 2 (v3 discovery, conditional v2)", n)
	}
	if n := testutil.ToFloat64(tk.refreshes.WithLabelValues("unchanged")); n != 1 {
		t.Errorf("unchanged polls: %v, want 1", n)
	}

	createCRD(t, "Doohickey", "size", "flavourOfTheWeek")
	path := "apis/" + testGroup + "/v1"
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := tk.Refresh(ctx); err != nil {
			return false, err
		}
		return bytes.Contains(tk.snap.Load().v3[path].json, []byte("flavourOfTheWeek")) && bytes.Contains(tk.snap.Load().v2.json, []byte("flavourOfTheWeek")), nil
	})
	if err != nil {
		t.Fatalf("the new field never reached the documents: %v", err)
	}
	if n := testutil.ToFloat64(tk.refreshes.WithLabelValues("updated")); n < 2 {
		t.Errorf("updated polls: %v, want the first load and the change", n)
	}
	// The served discovery points at the new document.
	d := discoveryOf(t, readAll(t, tk.served(http.MethodGet, "/openapi/v3", "", "", "alice")))
	r := tk.served(http.MethodGet, d[path], mediaJSON, "", "alice")
	if body := readAll(t, r); !bytes.Contains(body, []byte("flavourOfTheWeek")) {
		t.Errorf("%s does not have the new field", d[path])
	}
}

// TestBadUpstreamKeepsTheLastGoodDocuments: wrong answers fail the poll
// with an error that says what was wrong; the documents stay.
func TestBadUpstreamKeepsTheLastGoodDocuments(t *testing.T) {
	tk := newTestKeeper(t, coreV1)
	good := tk.snap.Load()
	realDiscovery := good.v3Discovery
	cases := []struct {
		name    string
		handler http.HandlerFunc
		wantErr string
	}{
		{"server error", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "etcd is on fire", 500) }, "500 Internal Server Error: etcd is on fire"},
		{"not JSON", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", mediaJSON)
			_, _ = w.Write([]byte("<html>"))
		}, "not JSON"},
		{"no paths", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", mediaJSON)
			_, _ = w.Write([]byte(`{}`))
		}, "no paths"},
		{"wrong media type", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/openapi/v3" {
				_, _ = w.Write([]byte(`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=ABC"}}}`))
				return
			}
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<html>`))
		}, `got "text/html"`},
		{"document does not match its hash", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", mediaJSON)
			if r.URL.Path == "/openapi/v3" {
				_, _ = w.Write([]byte(`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=ABC"}}}`))
				return
			}
			w.Header().Set("Etag", `"ABC"`)
			_, _ = w.Write([]byte(`{"openapi":"3.0.0"}`))
		}, "is not the SHA-512 of the document"},
		{"discovery URL elsewhere", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", mediaJSON)
			_, _ = w.Write([]byte(`{"paths":{"api/v1":{"serverRelativeURL":"https://evil.example/x?hash=1"}}}`))
		}, "not /openapi/v3/api/v1?hash="},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(c.handler)
			defer srv.Close()
			saved := tk.up
			tk.up = &upstream{client: srv.Client(), base: srv.URL}
			defer func() { tk.up = saved }()
			err := tk.Refresh(context.Background())
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want it to say %q", err, c.wantErr)
			}
			if tk.snap.Load() != good {
				t.Fatal("a failed poll replaced the documents")
			}
			if body := readAll(t, tk.served(http.MethodGet, "/openapi/v3", "", "", "alice")); !bytes.Equal(body, realDiscovery) {
				t.Fatal("a failed poll changed what is served")
			}
		})
	}
	if n := testutil.ToFloat64(tk.refreshes.WithLabelValues("error")); n != float64(len(cases)) {
		t.Errorf("error polls: %v, want %d", n, len(cases))
	}
}

// TestAggregatorGetsOnlyTheGroup: kube-aggregator (system:aggregator at the
// root) gets documents of the profile's group alone, and merging them the
// way its OpenAPI v2 controller does leaves every path and definition of
// the cluster's spec as it was.
func TestAggregatorGetsOnlyTheGroup(t *testing.T) {
	tk := newTestKeeper(t, coreV1, widgets)
	const gvPath = "apis/p.cache.cachetier.io/v1alpha1"

	d := discoveryOf(t, readAll(t, tk.served(http.MethodGet, "/openapi/v3", "", "", aggregatorUser)))
	if len(d) != 1 || d[gvPath] == "" {
		t.Fatalf("the aggregator's /openapi/v3 lists %v, want only %s", d, gvPath)
	}
	// The aggregator proxies clients' requests for the group's document
	// with their own identity.
	r := tk.served(http.MethodGet, d[gvPath], mediaJSON, "", "alice")
	v3 := readAll(t, r)
	if r.StatusCode != 200 || r.Header.Get("Cache-Control") != "public, immutable" {
		t.Fatalf("%s: %d %q", d[gvPath], r.StatusCode, r.Header.Get("Cache-Control"))
	}
	var doc3 struct {
		Paths map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(v3, &doc3); err != nil || len(doc3.Paths) != 1 || doc3.Paths["/"+gvPath+"/"] == nil {
		t.Fatalf("the group's v3 document: %v %s", err, v3)
	}
	if r := tk.served(http.MethodGet, d[gvPath], mediaV3ProtoAccept, "", "alice"); r.StatusCode != 200 || r.Header.Get("Content-Type") != mediaV3Proto {
		t.Errorf("the group's v3 document as protobuf: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}

	r = tk.served(http.MethodGet, "/openapi/v2", mediaJSON, "", aggregatorUser)
	var ours spec.Swagger
	if err := ours.UnmarshalJSON(readAll(t, r)); err != nil {
		t.Fatal(err)
	}
	_, clusterJSON := upstreamGet(t, "/openapi/v2", mediaJSON)
	var cluster, merged spec.Swagger
	if err := cluster.UnmarshalJSON(clusterJSON); err != nil {
		t.Fatal(err)
	}
	if err := merged.UnmarshalJSON(clusterJSON); err != nil {
		t.Fatal(err)
	}
	// kube-aggregator's updateServiceLocked and buildMergeSpecLocked.
	filtered := aggregator.FilterSpecByPathsWithoutSideEffects(&ours, []string{"/" + gvPath + "/"})
	if err := aggregator.MergeSpecsIgnorePathConflictRenamingDefinitionsAndParameters(&merged, filtered); err != nil {
		t.Fatal(err)
	}
	var added []string
	for p := range merged.Paths.Paths {
		if _, ok := cluster.Paths.Paths[p]; !ok {
			added = append(added, p)
		}
	}
	sort.Strings(added)
	if strings.Join(added, ",") != "/"+gvPath+"/" {
		t.Errorf("merging added paths %v, want only /%s/", added, gvPath)
	}
	if len(merged.Definitions) != len(cluster.Definitions) {
		for n := range merged.Definitions {
			if _, ok := cluster.Definitions[n]; !ok {
				t.Errorf("merging added definition %s (a renamed duplicate)", n)
			}
		}
	}

	// Below the prefix the aggregator's identity changes nothing: that is
	// a client's request proxied by the aggregator.
	const prefix = "/apis/p.cache.cachetier.io/v1alpha1"
	if d := discoveryOf(t, readAll(t, tk.served(http.MethodGet, prefix+"/openapi/v3", "", prefix, aggregatorUser))); d["api/v1"] == "" {
		t.Errorf("below the prefix the aggregator got %v", d)
	}
}

// byteCounter counts the body bytes of every upstream response.
type byteCounter struct{ n atomic.Int64 }

func (c *byteCounter) Read(rc io.ReadCloser) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{io.TeeReader(rc, writerFunc(func(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil })), rc}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func benchKeeper(b *testing.B) (*Keeper, *atomic.Int64, *byteCounter) {
	var requests atomic.Int64
	bytesIn := &byteCounter{}
	cfg := countingConfig(&requests)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil {
				resp.Body = bytesIn.Read(resp.Body)
			}
			return resp, err
		})
	})
	k, err := New(Options{Upstream: cfg, Served: []schema.GroupVersion{coreV1, widgets}, Group: "p.cache.cachetier.io", Version: "v1alpha1", Log: logr.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	return k, &requests, bytesIn
}

// BenchmarkRefreshUnchanged is the steady-state cost of one poll: what the
// tier pays (and asks of the apiserver) every interval.
func BenchmarkRefreshUnchanged(b *testing.B) {
	k, requests, bytesIn := benchKeeper(b)
	if err := k.Refresh(context.Background()); err != nil {
		b.Fatal(err)
	}
	r0, b0 := requests.Load(), bytesIn.n.Load()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := k.Refresh(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(requests.Load()-r0)/float64(b.N), "requests/op")
	b.ReportMetric(float64(bytesIn.n.Load()-b0)/float64(b.N), "bodyBytes/op")
}

// BenchmarkLoad is a full load (start-up, or every document changed).
func BenchmarkLoad(b *testing.B) {
	var held int
	var requests, bodies int64
	for i := 0; i < b.N; i++ {
		k, r, bytesIn := benchKeeper(b)
		if err := k.Refresh(context.Background()); err != nil {
			b.Fatal(err)
		}
		requests, bodies = r.Load(), bytesIn.n.Load()
		s := k.snap.Load()
		held = len(s.v2.json) + len(s.v2.proto) + len(s.groupV2.json) + len(s.groupV2.proto) + len(s.groupV3.json) + len(s.groupV3.proto)
		for _, d := range s.v3 {
			held += len(d.json) + len(d.proto)
		}
	}
	b.ReportMetric(float64(requests), "requests/op")
	b.ReportMetric(float64(bodies), "bodyBytes/op")
	b.ReportMetric(float64(held), "heldBytes")
}

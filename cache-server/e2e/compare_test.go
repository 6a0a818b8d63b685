package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// response is what a comparison looks at.
type response struct {
	code        int
	body        []byte
	retryAfter  string
	contentType string // media type without parameters
	encoding    string // Content-Encoding
}

func get(t *testing.T, cfg *rest.Config, path string, q url.Values, accept string) response {
	t.Helper()
	h := http.Header{}
	if accept != "" {
		h.Set("Accept", accept)
	}
	return getWith(t, cfg, path, q, h)
}

// getWith is get with the request's headers. A client that sets
// Accept-Encoding itself gets the body as sent (Go's transport only
// decompresses what it asked for).
func getWith(t *testing.T, cfg *rest.Config, path string, q url.Values, header http.Header) response {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Host + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header = header
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return response{code: resp.StatusCode, body: body, retryAfter: resp.Header.Get("Retry-After"), contentType: ct, encoding: resp.Header.Get("Content-Encoding")}
}

// listView is the comparable part of a list answer.
type listView struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		ResourceVersion    string `json:"resourceVersion"`
		Continue           string `json:"continue"`
		RemainingItemCount *int64 `json:"remainingItemCount"`
	} `json:"metadata"`
	Items []struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   struct {
			Namespace       string `json:"namespace"`
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	} `json:"items"`
}

func (l listView) keys() []string {
	out := make([]string, 0, len(l.Items))
	for _, it := range l.Items {
		out = append(out, fmt.Sprintf("%s %s/%s@%s", strings.TrimSpace(it.Kind+" "+it.APIVersion), it.Metadata.Namespace, it.Metadata.Name, it.Metadata.ResourceVersion))
	}
	return out
}

var digits = regexp.MustCompile(`[0-9]+`)

// statusView is the comparable part of an error: code, reason, the causes'
// types and the message with numbers (RVs) blanked out.
func statusView(t *testing.T, body []byte) string {
	t.Helper()
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" {
		return fmt.Sprintf("non-Status body %q", body)
	}
	var causes []string
	if st.Details != nil {
		for _, c := range st.Details.Causes {
			causes = append(causes, string(c.Type)+":"+c.Field)
		}
	}
	return fmt.Sprintf("%d %s %q causes=%v", st.Code, st.Reason, digits.ReplaceAllString(st.Message, "N"), causes)
}

// compareList sends the same LIST to the apiserver and the tier and
// compares status, items (keys, RVs, order), continue presence and
// remainingItemCount, then follows each side's continue tokens to the end.
func compareList(t *testing.T, path string, q url.Values, accept string) {
	t.Helper()
	if q.Get("limit") != "" && q.Get("resourceVersion") != "0" && !strings.Contains(path, "/namespaces/") &&
		strings.Contains(q.Get("fieldSelector"), "metadata.namespace=") {
		compareNamespaceFieldPaging(t, path, q)
		return
	}
	e := testEnv
	{
		page := 0
		want := get(t, e.admin, path, q, accept)
		got := get(t, e.tierAdmin, path, q, accept)
		if want.code != got.code {
			t.Fatalf("%s?%s page %d: status %d from tier, %d from apiserver\n tier: %s\n apiserver: %s", path, q.Encode(), page, got.code, want.code, got.body, want.body)
		}
		if want.code != http.StatusOK {
			if w, g := statusView(t, want.body), statusView(t, got.body); w != g {
				t.Fatalf("%s?%s: error differs\n tier:      %s\n apiserver: %s", path, q.Encode(), g, w)
			}
			if want.retryAfter != got.retryAfter {
				t.Fatalf("%s?%s: Retry-After %q from tier, %q from apiserver", path, q.Encode(), got.retryAfter, want.retryAfter)
			}
			return
		}
		var wl, gl listView
		if err := json.Unmarshal(want.body, &wl); err != nil {
			t.Fatalf("apiserver body: %v", err)
		}
		if err := json.Unmarshal(got.body, &gl); err != nil {
			t.Fatalf("tier body %q: %v", got.body, err)
		}
		if wl.Kind != gl.Kind || wl.APIVersion != gl.APIVersion {
			t.Fatalf("%s?%s: kind %s %s from tier, %s %s from apiserver", path, q.Encode(), gl.Kind, gl.APIVersion, wl.Kind, wl.APIVersion)
		}
		if w, g := strings.Join(wl.keys(), "\n"), strings.Join(gl.keys(), "\n"); w != g {
			t.Fatalf("%s?%s page %d: items differ\n tier (%d):\n%s\n apiserver (%d):\n%s", path, q.Encode(), page, len(gl.Items), g, len(wl.Items), w)
		}
		if (wl.Metadata.Continue == "") != (gl.Metadata.Continue == "") {
			t.Fatalf("%s?%s page %d: continue %q from tier, %q from apiserver", path, q.Encode(), page, gl.Metadata.Continue, wl.Metadata.Continue)
		}
		if fmt.Sprint(deref(wl.Metadata.RemainingItemCount)) != fmt.Sprint(deref(gl.Metadata.RemainingItemCount)) {
			t.Fatalf("%s?%s page %d: remainingItemCount %v from tier, %v from apiserver", path, q.Encode(), page, deref(gl.Metadata.RemainingItemCount), deref(wl.Metadata.RemainingItemCount))
		}
		if wl.Metadata.Continue == "" {
			return
		}
		// Follow the continuation on each side with its own token.
		next := url.Values{}
		for k, v := range q {
			if k != "resourceVersion" && k != "resourceVersionMatch" {
				next[k] = v
			}
		}
		wq, gq := cloneValues(next), cloneValues(next)
		wq.Set("continue", wl.Metadata.Continue)
		gq.Set("continue", gl.Metadata.Continue)
		comparePages(t, path, wq, gq, accept, page+1)
		return
	}
}

func comparePages(t *testing.T, path string, wq, gq url.Values, accept string, page int) {
	t.Helper()
	e := testEnv
	for ; ; page++ {
		want := get(t, e.admin, path, wq, accept)
		got := get(t, e.tierAdmin, path, gq, accept)
		if want.code != got.code {
			t.Fatalf("%s page %d: status %d from tier, %d from apiserver\n tier: %s\n apiserver: %s", path, page, got.code, want.code, got.body, want.body)
		}
		if want.code != http.StatusOK {
			if w, g := statusView(t, want.body), statusView(t, got.body); w != g {
				t.Fatalf("%s page %d: error differs\n tier:      %s\n apiserver: %s", path, page, g, w)
			}
			return
		}
		var wl, gl listView
		_ = json.Unmarshal(want.body, &wl)
		if err := json.Unmarshal(got.body, &gl); err != nil {
			t.Fatalf("tier body %q: %v", got.body, err)
		}
		if w, g := strings.Join(wl.keys(), "\n"), strings.Join(gl.keys(), "\n"); w != g {
			t.Fatalf("%s?%s page %d: items differ\n tier (%d):\n%s\n apiserver (%d):\n%s", path, gq.Encode(), page, len(gl.Items), g, len(wl.Items), w)
		}
		if fmt.Sprint(deref(wl.Metadata.RemainingItemCount)) != fmt.Sprint(deref(gl.Metadata.RemainingItemCount)) {
			t.Fatalf("%s page %d: remainingItemCount %v from tier, %v from apiserver", path, page, deref(gl.Metadata.RemainingItemCount), deref(wl.Metadata.RemainingItemCount))
		}
		if (wl.Metadata.Continue == "") != (gl.Metadata.Continue == "") {
			t.Fatalf("%s page %d: continue %q from tier, %q from apiserver", path, page, gl.Metadata.Continue, wl.Metadata.Continue)
		}
		if wl.Metadata.Continue == "" {
			return
		}
		wq.Set("continue", wl.Metadata.Continue)
		gq.Set("continue", gl.Metadata.Continue)
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func cloneValues(v url.Values) url.Values {
	out := url.Values{}
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// currentRV is the apiserver's RV now (from a consistent LIST).
func currentRV(t *testing.T) string {
	r := get(t, testEnv.admin, "/api/v1/namespaces", url.Values{"limit": {"1"}}, "")
	var l listView
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	return l.Metadata.ResourceVersion
}

func query(kv ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return q
}

// listTarget is a path to LIST and the selectors to LIST it with.
type listTarget struct {
	path      string
	selectors [][2]string // labelSelector, fieldSelector
}

// TestListMatchesAPIServer is the LIST request matrix: resourceVersion ×
// resourceVersionMatch × limit × selectors × scope, same data, same answers.
func TestListMatchesAPIServer(t *testing.T) { forEachTier(t, testListMatchesAPIServer) }

func testListMatchesAPIServer(t *testing.T) {
	rv := currentRV(t)
	targets := []listTarget{
		{"/api/v1/configmaps", [][2]string{{"", ""}, {"app=a", ""}, {"app in (a,b),tier=x", ""}, {"!tier", "metadata.namespace=ns-1"}, {"", "metadata.name=cm-007"}}},
		{"/api/v1/namespaces/ns-1/configmaps", [][2]string{{"", ""}, {"app!=a", ""}, {"", "metadata.name!=cm-001"}}},
		{"/api/v1/pods", [][2]string{{"", ""}, {"", "spec.nodeName=node-1"}, {"app=b", "status.phase=Pending"}}},
		{"/api/v1/secrets", [][2]string{{"", "type=Opaque"}, {"", "type=example.com/custom"}}},
		{"/api/v1/events", [][2]string{{"", "involvedObject.name=pod-01"}, {"", "reason=Pulled,type=Warning"}}},
		{"/api/v1/namespaces", [][2]string{{"", ""}, {"team=a", ""}}},
		{"/apis/example.cachetier.io/v1/widgets", [][2]string{{"", ""}, {"", "spec.color=red"}}},
		{"/apis/example.cachetier.io/v1/namespaces/ns-2/widgets", [][2]string{{"app=a", ""}}},
	}
	rvs := []string{"", "0", rv}
	rvms := []string{"", "NotOlderThan", "Exact"}
	limits := []string{"", "1", "7", "500"}
	n := 0
	for _, tg := range targets {
		for _, sel := range tg.selectors {
			for _, r := range rvs {
				for _, m := range rvms {
					for _, l := range limits {
						q := query("resourceVersion", r, "resourceVersionMatch", m, "limit", l, "labelSelector", sel[0], "fieldSelector", sel[1])
						t.Run(tg.path+"?"+q.Encode(), func(t *testing.T) { compareList(t, tg.path, q, "") })
						n++
					}
				}
			}
		}
	}
	t.Logf("compared %d LIST requests", n)
}

// TestListErrorsMatchAPIServer: malformed and contradictory parameters get
// the apiserver's status code, reason, message and causes.
func TestListErrorsMatchAPIServer(t *testing.T) { forEachTier(t, testListErrorsMatchAPIServer) }

func testListErrorsMatchAPIServer(t *testing.T) {
	rv := currentRV(t)
	cases := []url.Values{
		query("resourceVersion", "abc"),
		query("resourceVersion", "abc", "limit", "5"),
		query("resourceVersionMatch", "Bogus", "resourceVersion", rv),
		query("resourceVersionMatch", "Exact"),
		query("resourceVersionMatch", "Exact", "resourceVersion", "0"),
		query("resourceVersionMatch", "NotOlderThan"),
		query("limit", "abc"),
		query("limit", "-1"),
		query("continue", "not-a-token", "limit", "5"),
		query("continue", "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiIuLi8uLi9zZWNyZXRzIn0", "limit", "5"),
		query("continue", "eyJ2IjoibWV0YS5rOHMuaW8vdjIiLCJydiI6MSwic3RhcnQiOiJhIn0", "limit", "5"),
		query("labelSelector", "app=="),
		query("labelSelector", "a b"),
		query("fieldSelector", "foo=bar"),
		query("fieldSelector", "spec.nodeName=x"),
		query("fieldSelector", "metadata.name"),
		query("timeoutSeconds", "abc"),
	}
	for _, path := range []string{"/api/v1/configmaps", "/api/v1/namespaces/ns-1/configmaps"} {
		for _, q := range cases {
			t.Run(path+"?"+q.Encode(), func(t *testing.T) { compareList(t, path, q, "") })
		}
	}
}

// TestGetMatchesAPIServer compares single-object reads.
func TestGetMatchesAPIServer(t *testing.T) { forEachTier(t, testGetMatchesAPIServer) }

func testGetMatchesAPIServer(t *testing.T) {
	rv := currentRV(t)
	paths := []string{
		"/api/v1/namespaces/ns-1/configmaps/cm-001",
		"/api/v1/namespaces/ns-1/configmaps/does-not-exist",
		"/api/v1/namespaces/ns-3/pods/pod-02",
		"/api/v1/namespaces/ns-2",
		"/api/v1/namespaces/nope",
		"/apis/example.cachetier.io/v1/namespaces/ns-0/widgets/widget-01",
		"/apis/example.cachetier.io/v1/namespaces/ns-0/widgets/nope",
	}
	accepts := []string{"", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1"}
	for _, p := range paths {
		for _, r := range []string{"", "0", rv, "abc"} {
			for _, accept := range accepts {
				q := query("resourceVersion", r)
				t.Run(accept+" "+p+"?"+q.Encode(), func(t *testing.T) { compareGet(t, p, q, accept) })
			}
		}
	}
}

// compareGet sends the same GET to both and compares the answers byte for
// byte.
func compareGet(t *testing.T, p string, q url.Values, accept string) {
	t.Helper()
	want := get(t, testEnv.admin, p, q, accept)
	got := get(t, testEnv.tierAdmin, p, q, accept)
	if want.code != got.code {
		t.Fatalf("status %d from tier, %d from apiserver\n tier: %s\n apiserver: %s", got.code, want.code, got.body, want.body)
	}
	if want.code != http.StatusOK {
		if w, g := statusView(t, want.body), statusView(t, got.body); w != g {
			t.Fatalf("error differs\n tier:      %s\n apiserver: %s", g, w)
		}
		return
	}
	var wo, gobj map[string]any
	_ = json.Unmarshal(want.body, &wo)
	_ = json.Unmarshal(got.body, &gobj)
	if w, g := fmt.Sprint(wo), fmt.Sprint(gobj); w != g {
		t.Fatalf("object differs\n tier:      %s\n apiserver: %s", g, w)
	}
	// Byte for byte, the serializer's trailing newline included
	// (kubectl get --raw prints the body as it comes).
	if !bytes.Equal(got.body, want.body) {
		t.Fatalf("body differs\n tier:      %q\n apiserver: %q", got.body, want.body)
	}
}

// compareNamespaceFieldPaging covers a deliberate difference. For a
// cluster-wide LIST with fieldSelector=metadata.namespace=X and a limit,
// kube-apiserver 1.37 narrows the read to namespace X and writes a continue
// token relative to that namespace, then resolves the token against the
// cluster-wide prefix on the next page — so page two starts over and
// repeats items. The tier's tokens carry the full key and continue where
// the page ended. Assert the tier's pages add up to exactly the unpaginated
// answer of the apiserver, without duplicates.
func compareNamespaceFieldPaging(t *testing.T, path string, q url.Values) {
	t.Helper()
	if first := get(t, testEnv.admin, path, q, ""); first.code != http.StatusOK {
		got := get(t, testEnv.tierAdmin, path, q, "")
		if got.code != first.code || statusView(t, got.body) != statusView(t, first.body) {
			t.Fatalf("error differs\n tier:      %d %s\n apiserver: %d %s", got.code, statusView(t, got.body), first.code, statusView(t, first.body))
		}
		return
	}
	all := cloneValues(q)
	all.Del("limit")
	want := get(t, testEnv.admin, path, all, "")
	if want.code != http.StatusOK {
		t.Fatalf("apiserver: %d %s", want.code, want.body)
	}
	var wl listView
	if err := json.Unmarshal(want.body, &wl); err != nil {
		t.Fatal(err)
	}
	var got []string
	gq := cloneValues(q)
	for page := 0; page < 10000; page++ {
		r := get(t, testEnv.tierAdmin, path, gq, "")
		if r.code != http.StatusOK {
			t.Fatalf("tier page %d: %d %s", page, r.code, r.body)
		}
		var gl listView
		if err := json.Unmarshal(r.body, &gl); err != nil {
			t.Fatal(err)
		}
		got = append(got, gl.keys()...)
		if gl.Metadata.Continue == "" {
			break
		}
		gq.Del("resourceVersion")
		gq.Del("resourceVersionMatch")
		gq.Set("continue", gl.Metadata.Continue)
	}
	if w, g := strings.Join(wl.keys(), "\n"), strings.Join(got, "\n"); w != g {
		t.Fatalf("tier pages differ from the apiserver's unpaginated list\n tier:\n%s\n apiserver:\n%s", g, w)
	}
}

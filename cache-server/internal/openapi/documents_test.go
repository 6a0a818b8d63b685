package openapi

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

func TestServedPaths(t *testing.T) {
	got := slices.Sorted(maps.Keys(servedPaths([]schema.GroupVersion{{Version: "v1"}, {Group: "apps", Version: "v1"}, {Group: "apps", Version: "v1"}, {Group: "x.io", Version: "v2"}})))
	want := []string{"api", "api/v1", "apis", "apis/apps", "apis/apps/v1", "apis/x.io", "apis/x.io/v2"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("servedPaths: %v, want %v", got, want)
	}
}

func TestGroupNames(t *testing.T) {
	tag, op := groupNames("agg.cache.cachetier.io", "v1alpha1")
	if tag != "aggCacheCachetierIo_v1alpha1" || op != "getAggCacheCachetierIoV1alpha1APIResources" {
		t.Fatalf("groupNames: %s %s", tag, op)
	}
}

// TestNegotiate: kube-openapi's rules — the highest-q clause that names an
// offered type (or a wildcard) wins, JSON first among equals.
func TestNegotiate(t *testing.T) {
	for _, c := range []struct {
		accept string
		want   string // "" = 406
	}{
		{"", mediaJSON},
		{"*/*", mediaJSON},
		{"application/*", mediaJSON},
		{"application/json", mediaJSON},
		{mediaV2ProtoAccept, mediaV2Proto},
		{mediaV2Proto, mediaV2Proto},
		{mediaV2ProtoAccept + ",application/json;q=0.5", mediaV2Proto},
		{"application/json;q=0.5," + mediaV2ProtoAccept, mediaV2Proto},
		{"text/html", ""},
		{mediaV3ProtoAccept, ""},
	} {
		r := httptest.NewRequest("GET", "/openapi/v2", nil)
		if c.accept != "" {
			r.Header.Set("Accept", c.accept)
		}
		e, ok := negotiate(r, v2Encodings)
		if got := map[bool]string{true: e.contentType, false: ""}[ok]; got != c.want {
			t.Errorf("Accept %q: %q, want %q", c.accept, got, c.want)
		}
	}
}

func TestParseDiscovery(t *testing.T) {
	served := servedPaths([]schema.GroupVersion{{Version: "v1"}})
	got, err := parseDiscovery([]byte(`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AB"},"apis/apps/v1":{"serverRelativeURL":"/openapi/v3/apis/apps/v1?hash=CD"}}}`), served)
	if err != nil || !reflect.DeepEqual(got, map[string]string{"api/v1": "AB"}) {
		t.Fatalf("parseDiscovery: %v %v", got, err)
	}
	for body, want := range map[string]string{
		`[]`: "not JSON",
		`{}`: "no paths",
		`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1"}}}`:           "not /openapi/v3/api/v1?hash=",
		`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/apis/x/v1?hash=A"}}}`: "not /openapi/v3/api/v1?hash=",
	} {
		if _, err := parseDiscovery([]byte(body), served); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseDiscovery(%s): %v, want %q", body, err, want)
		}
	}
}

// FuzzParseDiscovery: any answer gives paths and hashes that round-trip
// through discoveryJSON and relativeURL, or an error; never a panic.
func FuzzParseDiscovery(f *testing.F) {
	f.Add([]byte(`{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AB"}}}`))
	f.Add([]byte(`{"paths":{"api":{"serverRelativeURL":"/openapi/v3/api?hash=A&hash=B"}}}`))
	f.Add([]byte(`{"paths":{"apis/x.io/v1":{"serverRelativeURL":"/openapi/v3/apis/x.io/../x.io/v1?hash=%41"}}}`))
	served := servedPaths([]schema.GroupVersion{{Version: "v1"}, {Group: "x.io", Version: "v1"}})
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parseDiscovery(body, served)
		if err != nil {
			return
		}
		docs := map[string]document{}
		for p, h := range got {
			if !served[p] || h == "" {
				t.Fatalf("kept %q (hash %q)", p, h)
			}
			docs[p] = document{etag: h}
		}
		out, err := discoveryJSON(docs)
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseDiscovery(out, served)
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("round trip: %v %v, want %v", again, err, got)
		}
	})
}

func TestSchemaClosure(t *testing.T) {
	schemas := map[string]json.RawMessage{
		"a": json.RawMessage(`{"properties":{"b":{"$ref":"#/definitions/b"}}}`),
		"b": json.RawMessage(`{"items":{"$ref": "#/components/schemas/c"}}`),
		"c": json.RawMessage(`{"properties":{"a":{"$ref":"#/definitions/a"}}}`),
		"d": json.RawMessage(`{}`),
	}
	got, err := schemaClosure(schemas, "a")
	if err != nil || strings.Join(slices.Sorted(maps.Keys(got)), ",") != "a,b,c" {
		t.Fatalf("closure: %v %v", slices.Sorted(maps.Keys(got)), err)
	}
	schemas["c"] = json.RawMessage(`{"$ref":"#/definitions/missing"}`)
	if _, err := schemaClosure(schemas, "a"); err == nil || !strings.Contains(err.Error(), "no schema missing") {
		t.Fatalf("missing schema: %v", err)
	}
}

// TestNotLoadedYet: before the first poll succeeds the documents answer
// 503 (the apiserver's answer while it has none) and Ready says why.
func TestNotLoadedYet(t *testing.T) {
	k, err := New(Options{Upstream: &rest.Config{Host: "https://127.0.0.1:1"}, Group: "p.cache.cachetier.io", Version: "v1alpha1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Ready(); err == nil || !strings.Contains(err.Error(), "not loaded") {
		t.Fatalf("Ready: %v", err)
	}
	for _, p := range []string{"/openapi/v2", "/openapi/v3", "/openapi/v3/api/v1"} {
		w := httptest.NewRecorder()
		k.ServeOpenAPI(w, httptest.NewRequest("GET", p, nil), p, "")
		if w.Code != http.StatusServiceUnavailable {
			t.Errorf("%s: %d, want 503", p, w.Code)
		}
	}
	if _, err := New(Options{Upstream: &rest.Config{Host: "https://127.0.0.1:1"}}); err == nil {
		t.Error("New without the aggregated group: no error")
	}
}

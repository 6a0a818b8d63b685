package front

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/internal/aggpath"
)

// TestServedBelowBothPrefixes: a request below the profile's prefix (what
// status.serverURL ends in) or below the group-version's own path (older
// kubeconfigs) is answered as the same request at the root; the
// group-version's path itself is the aggregator's discovery of the
// (empty) group; the prefix alone is no Kubernetes path.
func TestServedBelowBothPrefixes(t *testing.T) {
	bt := newBenchTier(t, benchObjects(20, 64))
	defer bt.stop()
	paths := aggpath.For("p")
	srv := New(Options{Resources: bt.srv.opts.Resources, Paths: paths, Metrics: bt.srv.opts.Metrics, Log: bt.srv.opts.Log})
	for _, path := range []string{"/api", "/apis", "/api/v1", "/api/v1/configmaps", "/api/v1/namespaces/bench/configmaps", "/api/v1/namespaces/bench/configmaps/cm-000003"} {
		want := serve(t, srv, path, "")
		if want.code != http.StatusOK {
			t.Fatalf("%s at the root: %d %s", path, want.code, want.body)
		}
		for _, under := range []string{paths.Prefix, paths.Root} {
			got := serve(t, srv, under+path, "")
			if got.code != want.code || got.contentType != want.contentType || !bytes.Equal(got.body, want.body) {
				t.Errorf("%s: %d %s\nwant %d %s", under+path, got.code, got.body, want.code, want.body)
			}
		}
	}
	d := serve(t, srv, paths.Root, "")
	var l metav1.APIResourceList
	if err := json.Unmarshal(d.body, &l); err != nil || d.code != http.StatusOK || l.GroupVersion != "p.cache.cachetier.io/v1alpha1" || l.Kind != "APIResourceList" {
		t.Errorf("group-version discovery: %d %s", d.code, d.body)
	}
	for _, path := range []string{paths.Prefix, paths.Prefix + "/", paths.Prefix + "x/api", "/apis/q.cache.cachetier.io/v1alpha1/watch/api/v1/configmaps"} {
		if got := serve(t, srv, path, ""); got.code != http.StatusNotFound {
			t.Errorf("%s: %d %s, want 404", path, got.code, got.body)
		}
	}
}

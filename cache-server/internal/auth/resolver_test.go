package auth

import (
	"net/http/httptest"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/internal/aggpath"
)

// TestPrefixResolver: a request below either aggregated prefix is
// authorized as the Kubernetes request below it, the group-version's own
// path as the non-resource URL it is.
func TestPrefixResolver(t *testing.T) {
	p := aggpath.For("p")
	r := &prefixResolver{paths: p, factory: &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}}
	for _, c := range []struct {
		target                             string
		resource                           bool
		verb, group, ns, res, name, subres string
		path                               string
	}{
		{target: p.Prefix + "/api/v1/namespaces/x/pods?watch=1", resource: true, verb: "watch", ns: "x", res: "pods"},
		{target: p.Prefix + "/api/v1/pods?fieldSelector=spec.nodeName%3Dn", resource: true, verb: "list", res: "pods"},
		{target: p.Prefix + "/api/v1/namespaces/x/secrets/s", resource: true, verb: "get", ns: "x", res: "secrets", name: "s"},
		{target: p.Prefix + "/apis/apps/v1/deployments?watch=true", resource: true, verb: "watch", group: "apps", res: "deployments"},
		{target: p.Root + "/api/v1/namespaces/x/pods", resource: true, verb: "list", ns: "x", res: "pods"},
		{target: p.Root + "/apis/apps/v1/namespaces/x/deployments/d/status", resource: true, verb: "get", group: "apps", ns: "x", res: "deployments", name: "d", subres: "status"},
		{target: p.Prefix + "/api", verb: "get", path: "/api"},
		{target: p.Prefix + "/openapi/v3", verb: "get", path: "/openapi/v3"},
		{target: p.Root, verb: "get", path: p.Root},
		{target: p.Prefix, verb: "get", path: "/watch"},
		{target: "/api/v1/pods", resource: true, verb: "list", res: "pods"},
		{target: "/metrics", verb: "get", path: "/metrics"},
	} {
		info, err := r.NewRequestInfo(httptest.NewRequest("GET", c.target, nil))
		if err != nil {
			t.Fatalf("%s: %v", c.target, err)
		}
		if info.IsResourceRequest != c.resource || info.Verb != c.verb || info.APIGroup != c.group || info.Namespace != c.ns ||
			info.Resource != c.res || info.Name != c.name || info.Subresource != c.subres || (!c.resource && info.Path != c.path) {
			t.Errorf("%s: %+v", c.target, info)
		}
	}
}

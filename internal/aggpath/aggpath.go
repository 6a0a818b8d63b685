// Package aggpath holds the paths under which kube-apiserver's aggregation
// layer reaches a profile's tier, and the mapping from a request's path back
// to the Kubernetes path it reads. The operator (status.serverURL), the
// cache-server (routing, authorization, OpenAPI redirects) and the tools that
// start tiers (hack/...) all take them from here, so they cannot disagree.
//
// A profile's APIService registers the group-version
// /apis/<profile>.cache.cachetier.io/v1alpha1 (Root). Clients read through
// Prefix, Root followed by the segment "watch": kube-apiserver's RequestInfo
// takes a first segment "watch" after a group-version as the verb
// (k8s.io/apiserver pkg/endpoints/request/requestinfo.go, specialVerbs), so
// every request below Prefix is a watch to the apiserver and thus
// long-running: neither --request-timeout nor a request deadline cuts it, and
// priority and fairness holds its seat only until the aggregator hands it to
// the tier (kube-aggregator's proxy calls RequestDelegated). Below Root
// itself, a watch is "get" of resource "api" to the apiserver and is cut at
// --request-timeout (60 s by default). The tier serves both.
package aggpath

import (
	"strings"

	"github.com/cachetier/cachetier/api/v1alpha1"
)

// WatchSegment is the path segment after the group-version that makes
// kube-apiserver classify a request as verb "watch". "proxy", the other
// special verb, would also be long-running, but skips priority and fairness
// altogether and needs the proxy verb in RBAC.
const WatchSegment = "watch"

// Paths are the aggregated paths of one profile. The zero value has none:
// Strip leaves every path as it is.
type Paths struct {
	// Group is the profile's API group: <profile>.cache.cachetier.io.
	Group string
	// Root is the group-version's path, /apis/<group>/v1alpha1: what the
	// aggregator's discovery reads, and the prefix the first releases gave
	// users (still served; the apiserver cuts its watches at its
	// --request-timeout).
	Root string
	// Prefix is Root + "/watch": the prefix users read through.
	Prefix string
}

// For returns the paths of the profile named profile.
func For(profile string) Paths {
	g := profile + "." + v1alpha1.APIGroupSuffix
	root := "/apis/" + g + "/" + v1alpha1.AggregatedAPIVersion
	return Paths{Group: g, Root: root, Prefix: root + "/" + WatchSegment}
}

// GroupVersion is the APIService's group-version, <group>/v1alpha1.
func (p Paths) GroupVersion() string {
	return p.Group + "/" + v1alpha1.AggregatedAPIVersion
}

// ServerURL is the kubeconfig server URL that reads through the profile:
// the apiserver's URL (trailing slashes dropped) followed by Prefix. kubectl
// and client-go append /api/v1/..., /apis/... to it.
func (p Paths) ServerURL(apiServerURL string) string {
	return strings.TrimRight(apiServerURL, "/") + p.Prefix
}

// RootServerURL is the server URL of the first releases (apiserver URL +
// Root): it still works, but the apiserver cuts its watches at its request
// timeout.
func (p Paths) RootServerURL(apiServerURL string) string {
	return strings.TrimRight(apiServerURL, "/") + p.Root
}

// Strip maps the path of a request to the tier to the Kubernetes path it
// reads, and says which prefix it came under:
//
//	<Prefix>/<rest>  -> /<rest>, Prefix
//	<Root>/<rest>    -> /<rest>, Root
//	<Root>           -> "",      Root   (the group-version's discovery)
//	anything else    -> path,    ""     (the tier's own root)
//
// Prefix is tried first: below Root, a Kubernetes path never starts with
// /watch (they start with /api, /apis, /version, /openapi), so a first
// segment "watch" always means Prefix. Prefix alone, without a path below
// it, is the path /watch below Root, which the tier does not serve (the
// apiserver refuses it before: its RequestInfo needs a resource after the
// verb). rest is always a suffix of path that is empty or starts with "/".
func (p Paths) Strip(path string) (rest, under string) {
	if p.Root == "" {
		return path, ""
	}
	if r, ok := below(path, p.Prefix); ok && r != "" {
		return r, p.Prefix
	}
	if r, ok := below(path, p.Root); ok {
		return r, p.Root
	}
	return path, ""
}

// below returns the part of path after prefix when path is prefix itself
// ("") or continues it with "/".
func below(path, prefix string) (string, bool) {
	r, ok := strings.CutPrefix(path, prefix)
	if !ok || (r != "" && r[0] != '/') {
		return "", false
	}
	return r, true
}

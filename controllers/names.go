// Package controllers reconciles CacheProfiles into a cache-server fleet.
//
// The desired children of a profile are built by the pure functions in
// builders.go (no client, no clock, no randomness: certificates are passed
// in), applied idempotently by apply.go, and the profile's status is computed
// from observed children by the pure functions in status.go. The reconciler in
// cacheprofile_controller.go only wires these together.
package controllers

import (
	"fmt"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// Label keys put on every child. Selection of children (cache filtering,
// cleanup, pod selectors) relies on them, so they are constants, not options.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelPartOf    = "app.kubernetes.io/part-of"
	// LabelProfile carries the owning profile's name; cleanup lists children
	// by it, so it must be present on every child, cluster-scoped ones too.
	LabelProfile = "cachetier.io/profile"
	// LabelShard carries the shard index on shard pods so that each shard's
	// PodDisruptionBudget and anti-affinity select only its own replicas.
	LabelShard = "cachetier.io/shard"

	ManagedByValue = "cachetier-operator"
	AppName        = "cache-server"

	ComponentShard = "shard"
	ComponentFront = "front"
	ComponentAuth  = "auth"

	// AnnotationDesiredHash records the hash of the object the operator last
	// applied; see apply.go for why a hash is needed besides a field compare.
	AnnotationDesiredHash = "cachetier.io/desired-hash"
	// AnnotationConfigHash on pod templates restarts pods when the rendered
	// configuration they read at start changes.
	AnnotationConfigHash = "cachetier.io/config-hash"
	// AnnotationCertHash on the front pod template restarts the front when
	// its serving certificate is rotated. Shard pods have none: the
	// cache-server re-reads the mounted certificate files, and a restart
	// would drop the shard's cache.
	AnnotationCertHash = "cachetier.io/serving-cert-hash"

	// FieldOwner is the server-side apply field manager of the operator.
	FieldOwner = "cachetier-operator"
	// Finalizer makes deletion wait until every child, including the
	// cluster-scoped ones and the RoleBinding in kube-system, is removed.
	// Owner references alone would leave that to the garbage collector,
	// which is absent in some environments (envtest) and slow in others.
	Finalizer = "cachetier.io/cleanup"

	// AuthReaderNamespace and AuthReaderRole: the front reads the
	// request-header CA from kube-system/extension-apiserver-authentication,
	// which this bootstrap Role grants.
	AuthReaderNamespace = "kube-system"
	AuthReaderRole      = "extension-apiserver-authentication-reader"
)

// Ports of the cache-server containers. They are the contract with the
// cache-server flags documented in docs/operator.md.
const (
	FrontPort   = 8443 // HTTPS aggregated API
	ShardPort   = 8444 // shard API, called by the front
	MetricsPort = 9090 // plain HTTP: /metrics, /readyz, /livez
)

// CacheServerBinary is where the project's Dockerfile installs the
// cache-server in the image (the image's entrypoint is the manager).
const CacheServerBinary = "/cache-server"

// Paths where the rendered configuration and certificates are mounted.
const (
	ConfigMountPath  = "/etc/cachetier/config"
	TLSMountPath     = "/etc/cachetier/tls"
	ProfileConfigKey = "cacheprofile.yaml"
	TopologyKey      = "topology.yaml"
	// TLSCAKey in the serving Secret (next to tls.crt and tls.key) holds
	// the CA bundle fronts verify shards with.
	TLSCAKey = "ca.crt"
)

// ShardNonResourceURLs is what shards authorize every call against (a
// SubjectAccessReview for a non-resource URL, verb get); the fleet's
// ClusterRole grants it to the fleet's ServiceAccount, which the fronts
// present to the shards.
const ShardNonResourceURLs = "/shard/v1/*"

// Names of the children of one profile. Profile names are at most 40
// characters (enforced by the CRD), so every derived name stays within the
// 63-character limit of Service and label values.
func shardName(p *cachev1alpha1.CacheProfile, i int) string {
	return fmt.Sprintf("%s-shard-%d", p.Name, i)
}
func shardsServiceName(p *cachev1alpha1.CacheProfile) string { return p.Name + "-shards" }
func frontName(p *cachev1alpha1.CacheProfile) string         { return p.Name + "-front" }
func serviceAccountName(p *cachev1alpha1.CacheProfile) string {
	return p.Name + "-cache-server"
}
func configMapName(p *cachev1alpha1.CacheProfile) string     { return p.Name + "-config" }
func caSecretName(p *cachev1alpha1.CacheProfile) string      { return p.Name + "-ca" }
func servingSecretName(p *cachev1alpha1.CacheProfile) string { return p.Name + "-serving-cert" }

// clusterRoleName is also used for the ClusterRoleBinding and the kube-system
// RoleBinding; the "cachetier:" prefix keeps them apart from other tools.
func clusterRoleName(p *cachev1alpha1.CacheProfile) string {
	return "cachetier:" + p.Name + ":cache-server"
}
func shardsReaderName(p *cachev1alpha1.CacheProfile) string { return p.Name + "-shards-reader" }

// readerClusterRoleName names the ClusterRole users are bound to (or get
// through view/edit/admin) to read through the profile's aggregated paths.
func readerClusterRoleName(p *cachev1alpha1.CacheProfile) string {
	return "cachetier:" + p.Name + ":reader"
}
func authReaderBindingName(p *cachev1alpha1.CacheProfile) string {
	return "cachetier:" + p.Name + ":auth-reader"
}

// APIGroup is the aggregated API group a profile is served under.
func APIGroup(p *cachev1alpha1.CacheProfile) string {
	return aggpath.For(p.Name).Group
}

// APIServiceName is the name of the profile's APIService ("<version>.<group>"
// is mandatory for APIServices).
func APIServiceName(p *cachev1alpha1.CacheProfile) string {
	return cachev1alpha1.AggregatedAPIVersion + "." + APIGroup(p)
}

// ServerURL is the kubeconfig server URL that reads through the profile:
// the apiserver URL followed by the profile's aggregated prefix
// (aggpath.Paths.Prefix, the group-version's path plus "/watch", so that
// the apiserver treats every request through it as long-running and does
// not cut watches at its request timeout). client-go appends /api/v1/...
// and /apis/... to it, which the front serves.
func ServerURL(apiServerURL string, p *cachev1alpha1.CacheProfile) string {
	return aggpath.For(p.Name).ServerURL(apiServerURL)
}

// commonLabels are on every child; selectorLabels are the immutable subset
// used in StatefulSet/Deployment selectors (never add labels there later:
// selectors cannot change).
func commonLabels(p *cachev1alpha1.CacheProfile, component string) map[string]string {
	return map[string]string{
		LabelName:      AppName,
		LabelInstance:  p.Name,
		LabelComponent: component,
		LabelManagedBy: ManagedByValue,
		LabelPartOf:    "cachetier",
		LabelProfile:   p.Name,
	}
}

func selectorLabels(p *cachev1alpha1.CacheProfile, component string) map[string]string {
	return map[string]string{
		LabelName:      AppName,
		LabelInstance:  p.Name,
		LabelComponent: component,
	}
}

func shardSelectorLabels(p *cachev1alpha1.CacheProfile, i int) map[string]string {
	l := selectorLabels(p, ComponentShard)
	l[LabelShard] = fmt.Sprint(i)
	return l
}

func mergeLabels(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

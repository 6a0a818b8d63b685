package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults that the cache-server applies when a spec is read from a file
// (standalone mode) and the CRD schema applies at admission.
const (
	DefaultHashShards       = 16
	DefaultFreshnessTimeout = "3s"
	DefaultHistoryWindow    = "150s"

	// Operator-only defaults; the schema applies the same values so that a
	// stored profile always shows what is actually run.
	DefaultShards               = 2
	DefaultReplicasPerShard     = 2
	DefaultFrontReplicas        = 2
	DefaultServicePort          = 443
	DefaultGroupPriorityMinimum = 1000
	DefaultVersionPriority      = 15
)

// Condition types set on a CacheProfile's status.
const (
	// ConditionAvailable is True when every shard has a ready replica, the
	// front has an available replica and the APIService reports Available:
	// clients using the profile's server URL get answers.
	ConditionAvailable = "Available"
	// ConditionProgressing is True while a rollout (creation, spec change,
	// certificate rotation, shard count change) has not finished.
	ConditionProgressing = "Progressing"
	// ConditionDegraded is True when a part that should be working is not;
	// the reason and message name that part.
	ConditionDegraded = "Degraded"
)

// APIGroupSuffix is appended to a profile's name to form the aggregated API
// group it is served under, e.g. profile "fleet" -> "fleet.cache.cachetier.io".
const APIGroupSuffix = "cache.cachetier.io"

// AggregatedAPIVersion is the version of every profile's aggregated API group.
const AggregatedAPIVersion = "v1alpha1"

// CachedResource names one resource to cache and how to select and index it.
type CachedResource struct {
	// Group of the resource; empty for the core group.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Group string `json:"group,omitempty"`
	// Version of the resource, e.g. v1.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^v[0-9]+((alpha|beta)[0-9]+)?$`
	Version string `json:"version"`
	// Resource is the plural resource name, e.g. pods.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Resource string `json:"resource"`
	// NamespaceSelector limits ingestion to namespaces whose labels match.
	// Objects in other namespaces are never cached nor served.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="namespaceSelector: matchExpressions operator must be one of In, NotIn, Exists, DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",message="namespaceSelector: operators In and NotIn need at least one value, Exists and DoesNotExist take none"
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// LabelSelector limits ingestion to objects whose labels match.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="labelSelector: matchExpressions operator must be one of In, NotIn, Exists, DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",message="labelSelector: operators In and NotIn need at least one value, Exists and DoesNotExist take none"
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	// FieldIndexes are fields kept in an index, so that a LIST or watch
	// whose field selector requires one of them to equal a value ("=" or
	// "==") reads only the objects with that value instead of scanning the
	// resource. Each must be a field selectors accept for the resource,
	// under the name they use: metadata.name, a built-in resource's field
	// selector fields (e.g. pods' status.phase or spec.schedulerName), or
	// a custom resource's selectableFields (e.g. spec.color); not
	// metadata.namespace (objects are already kept in namespace order) nor
	// an alias (pods' spec.host is spec.nodeName). Pods' and
	// resourceslices' spec.nodeName, which kube-apiserver itself indexes,
	// are indexed without being listed.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z][a-zA-Z0-9]*(\.[a-zA-Z][a-zA-Z0-9]*)*$`
	FieldIndexes []string `json:"fieldIndexes,omitempty"`
}

// Scheduling places the cache-server pods (shards and front).
type Scheduling struct {
	// NodeSelector is copied to every cache-server pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations are copied to every cache-server pod. Unless they
	// tolerate node.kubernetes.io/unreachable or not-ready (NoExecute)
	// themselves, the operator adds tolerations of both for 30 s (instead
	// of Kubernetes' 300 s): a pod on a lost node is evicted, and replaced
	// elsewhere, soon after the node is found lost.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity is copied to every cache-server pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// TopologySpreadConstraints are copied to every cache-server pod. Their
	// labelSelector should use the labels app.kubernetes.io/instance (the
	// profile name) and app.kubernetes.io/component (shard or front).
	// Unless one of them spreads over kubernetes.io/hostname, the operator
	// adds one per shard and one for the fronts (maxSkew 1, DoNotSchedule,
	// nodeTaintsPolicy Honor): replicas of one shard, and the fronts, on
	// different nodes whenever there are enough schedulable nodes, spread
	// evenly otherwise, and never held Pending on a one-node cluster.
	// +optional
	// +listType=atomic
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// PriorityClassName of every cache-server pod.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
}

// APIServiceExpose controls the registration of the front with the
// aggregation layer.
type APIServiceExpose struct {
	// Enabled registers the APIService v1alpha1.<profile>.cache.cachetier.io.
	// Without it the front is only reachable through its Service.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// GroupPriorityMinimum of the APIService.
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20000
	// +optional
	GroupPriorityMinimum int32 `json:"groupPriorityMinimum,omitempty"`
	// VersionPriority of the APIService.
	// +kubebuilder:default=15
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	VersionPriority int32 `json:"versionPriority,omitempty"`
}

// ServiceExpose shapes the front Service.
type ServiceExpose struct {
	// Port the front Service listens on; the APIService points at it.
	// +kubebuilder:default=443
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// ClusterIP requests a fixed cluster IP for the front Service. It is
	// immutable once the Service exists (the API server refuses changes).
	// +optional
	// +kubebuilder:validation:MaxLength=45
	ClusterIP string `json:"clusterIP,omitempty"`
	// Annotations added to the front Service (e.g. for a service mesh).
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Expose says how clients reach the front.
type Expose struct {
	// APIService registration with the aggregation layer.
	// +kubebuilder:default={}
	// +optional
	APIService APIServiceExpose `json:"apiService,omitempty"`
	// Service shaping of the front Service.
	// +kubebuilder:default={}
	// +optional
	Service ServiceExpose `json:"service,omitempty"`
}

// CacheProfileSpec says which resources the tier caches and how it runs.
// +kubebuilder:validation:XValidation:rule="self.shards <= self.hashShards",message="shards must not exceed hashShards: every shard needs at least one hash shard"
type CacheProfileSpec struct {
	// Resources to cache. A resource (group and resource) may appear once.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule="self.all(x, self.exists_one(y, (has(y.group) ? y.group : '') == (has(x.group) ? x.group : '') && y.resource == x.resource))",message="resources must be unique: the same group and resource is listed more than once"
	Resources []CachedResource `json:"resources"`
	// HashShards is the number of hash shards objects are spread over
	// (xxhash64 of namespace/name modulo HashShards). Changing it rehashes
	// every object: all shards restart and reload.
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +optional
	HashShards int32 `json:"hashShards,omitempty"`
	// Shards is the number of shard StatefulSets the hash shards are placed
	// on (contiguous ranges). Changing it moves whole hash shards between
	// shards; see docs/operator.md for the rollout order.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	Shards int32 `json:"shards,omitempty"`
	// ReplicasPerShard is the number of identical replicas of each shard.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +optional
	ReplicasPerShard int32 `json:"replicasPerShard,omitempty"`
	// FrontReplicas is the number of front (aggregated API server) replicas.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	// +optional
	FrontReplicas int32 `json:"frontReplicas,omitempty"`
	// FreshnessTimeout bounds how long a consistent read waits for the cache
	// to catch up with the apiserver before answering 504.
	// +kubebuilder:default="3s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('100ms') && duration(self) <= duration('60s')",message="freshnessTimeout must be between 100ms and 60s"
	// +optional
	FreshnessTimeout *metav1.Duration `json:"freshnessTimeout,omitempty"`
	// HistoryWindow is how long past states are kept for watch resumption
	// and pagination snapshots. At least the apiserver's 75s.
	// +kubebuilder:default="150s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('75s') && duration(self) <= duration('1h')",message="historyWindow must be between 75s and 1h"
	// +optional
	HistoryWindow *metav1.Duration `json:"historyWindow,omitempty"`
	// ServerConcurrencyLimit is the number of seats API Priority and
	// Fairness shares among the cluster's priority levels on each front
	// (and on a standalone tier): what kube-apiserver's
	// --max-requests-inflight plus --max-mutating-requests-inflight are to
	// it. The tier classifies, queues and rejects (429 with Retry-After)
	// by the cluster's own FlowSchemas and PriorityLevelConfigurations.
	// Unset: 50 seats per CPU core of the container's CPU limit (of the
	// CPUs it may run on when it has none), at least 20. Changing it
	// restarts the fronts only.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	ServerConcurrencyLimit *int32 `json:"serverConcurrencyLimit,omitempty"`
	// Image of the cache-server. Empty means the operator's own image (one
	// image carries both binaries), or its RELATED_IMAGE_CACHE_SERVER
	// environment variable when that is set.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`
	// Resources (requests and limits) of each cache-server pod.
	// +optional
	PodResources corev1.ResourceRequirements `json:"podResources,omitempty"`
	// Scheduling of the cache-server pods.
	// +optional
	Scheduling Scheduling `json:"scheduling,omitempty"`
	// Expose says how clients reach the front.
	// +kubebuilder:default={}
	// +optional
	Expose Expose `json:"expose,omitempty"`
}

// ShardStatus is the observed state of one shard StatefulSet.
type ShardStatus struct {
	// Name of the shard's StatefulSet.
	Name string `json:"name"`
	// HashShards placed on this shard, as a range "first-last".
	HashShards string `json:"hashShards"`
	// Replicas desired.
	Replicas int32 `json:"replicas"`
	// ReadyReplicas observed.
	ReadyReplicas int32 `json:"readyReplicas"`
}

// CacheProfileStatus is the observed state of a CacheProfile.
type CacheProfileStatus struct {
	// ObservedGeneration is the generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Available, Progressing, Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Shards is the per-shard readiness, in shard order.
	// +optional
	// +listType=atomic
	Shards []ShardStatus `json:"shards,omitempty"`
	// ReadyShards counts shards with at least one ready replica.
	// +optional
	ReadyShards int32 `json:"readyShards,omitempty"`
	// Ready is "readyShards/shards", for the printer column.
	// +optional
	Ready string `json:"ready,omitempty"`
	// FrontReadyReplicas counts ready front replicas.
	// +optional
	FrontReadyReplicas int32 `json:"frontReadyReplicas,omitempty"`
	// Front is "frontReadyReplicas/frontReplicas", for the printer column.
	// +optional
	Front string `json:"front,omitempty"`
	// APIServiceName is the name of the APIService registering the front.
	// +optional
	APIServiceName string `json:"apiServiceName,omitempty"`
	// ServerURL is what a kubeconfig's cluster.server should be set to so
	// that kubectl and client-go read through this profile.
	// +optional
	ServerURL string `json:"serverURL,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cp,categories=cachetier
// +kubebuilder:printcolumn:name="Shards",type=integer,JSONPath=`.spec.shards`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Front",type=string,JSONPath=`.status.front`
// +kubebuilder:printcolumn:name="Available",type=string,JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].reason`,priority=1
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.status.serverURL`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') && size(self.metadata.name) <= 40",message="metadata.name must be a DNS label of at most 40 characters (it prefixes child object names and forms the API group <name>.cache.cachetier.io)"

// CacheProfile declares a watch-cache tier in front of the apiserver.
type CacheProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   CacheProfileSpec   `json:"spec"`
	Status CacheProfileStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CacheProfileList is a list of CacheProfiles.
type CacheProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheProfile `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CacheProfile{}, &CacheProfileList{})
}

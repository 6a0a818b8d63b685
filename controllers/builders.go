package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/cachetier/cachetier/api/topology"
	"sort"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// Options are the operator-wide settings the builders need besides the
// profile. They come from manager flags, never from package state.
type Options struct {
	// Namespace receives every namespaced child of every profile (the
	// operator's own namespace by default). Profiles are cluster-scoped, so
	// they cannot name a namespace of their own without letting any profile
	// author place pods with broad read access anywhere.
	Namespace string
	// DefaultImage of the cache-server when a profile does not set one.
	DefaultImage string
	// APIServerURL is the externally reachable apiserver URL used to build
	// status.serverURL.
	APIServerURL string
}

// Certificates is the TLS material of one profile: the operator's CA (kept in
// its own Secret, never mounted) and the fleet's serving certificate, which
// fronts and shards both serve with.
type Certificates struct {
	CACertPEM         []byte
	CAKeyPEM          []byte
	PreviousCACertPEM []byte // still trusted in caBundle until it expires
	ServingCertPEM    []byte
	ServingKeyPEM     []byte
}

// CABundle is what the aggregator must trust: the current CA and, during a
// CA rotation, the previous one, so fronts still serving a certificate
// signed by the old CA keep working until they restart.
func (c Certificates) CABundle() []byte {
	out := append([]byte{}, c.CACertPEM...)
	return append(out, c.PreviousCACertPEM...)
}

// ShardAssignment is the contiguous range of hash shards one shard serves.
type ShardAssignment struct {
	Index int
	Name  string
	First int32
	Last  int32
}

// HashShardRange renders the range as the shard's --hash-shards flag value.
func (a ShardAssignment) HashShardRange() string { return fmt.Sprintf("%d-%d", a.First, a.Last) }

// AssignHashShards spreads hashShards over shards in contiguous ranges whose
// sizes differ by at most one (the first hashShards%shards get one more).
// Contiguous ranges mean a change of the shard count moves whole hash shards
// and each shard's range can be passed as a single flag.
func AssignHashShards(p *cachev1alpha1.CacheProfile) []ShardAssignment {
	var out []ShardAssignment
	for i, r := range topology.Assign(p.Spec.HashShards, p.Spec.Shards) {
		out = append(out, ShardAssignment{Index: i, Name: shardName(p, i), First: r.First, Last: r.Last})
	}
	return out
}

// WithDefaults returns a copy of the profile with every defaulted field set
// to the value the CRD schema would give it. The schema normally does this at
// admission; doing it again here keeps the builders total (profiles stored
// before a field existed, or built in tests) and the rendered config explicit.
func WithDefaults(in *cachev1alpha1.CacheProfile) *cachev1alpha1.CacheProfile {
	p := in.DeepCopy()
	s := &p.Spec
	if s.HashShards == 0 {
		s.HashShards = cachev1alpha1.DefaultHashShards
	}
	if s.Shards == 0 {
		s.Shards = min(cachev1alpha1.DefaultShards, s.HashShards)
	}
	if s.ReplicasPerShard == 0 {
		s.ReplicasPerShard = cachev1alpha1.DefaultReplicasPerShard
	}
	if s.FrontReplicas == 0 {
		s.FrontReplicas = cachev1alpha1.DefaultFrontReplicas
	}
	if s.FreshnessTimeout == nil {
		s.FreshnessTimeout = mustDuration(cachev1alpha1.DefaultFreshnessTimeout)
	}
	if s.HistoryWindow == nil {
		s.HistoryWindow = mustDuration(cachev1alpha1.DefaultHistoryWindow)
	}
	if s.Expose.APIService.Enabled == nil {
		s.Expose.APIService.Enabled = ptr.To(true)
	}
	if s.Expose.APIService.GroupPriorityMinimum == 0 {
		s.Expose.APIService.GroupPriorityMinimum = cachev1alpha1.DefaultGroupPriorityMinimum
	}
	if s.Expose.APIService.VersionPriority == 0 {
		s.Expose.APIService.VersionPriority = cachev1alpha1.DefaultVersionPriority
	}
	if s.Expose.Service.Port == 0 {
		s.Expose.Service.Port = cachev1alpha1.DefaultServicePort
	}
	return p
}

// Desired is every child of one profile. ServiceMonitor, PrometheusRule and
// APIService are nil when not wanted (the APIService is then deleted; the
// monitoring kinds are only unwanted when their CRD is gone).
type Desired struct {
	ServiceAccount      *corev1.ServiceAccount
	ConfigMap           *corev1.ConfigMap
	CASecret            *corev1.Secret
	ServingSecret       *corev1.Secret
	ShardsService       *corev1.Service
	FrontService        *corev1.Service
	Shards              []*appsv1.StatefulSet
	ShardPDBs           []*policyv1.PodDisruptionBudget
	Front               *appsv1.Deployment
	FrontPDB            *policyv1.PodDisruptionBudget
	ClusterRole         *rbacv1.ClusterRole
	ClusterRoleBinding  *rbacv1.ClusterRoleBinding
	ReaderClusterRole   *rbacv1.ClusterRole
	AuthReaderBinding   *rbacv1.RoleBinding
	ShardsReaderRole    *rbacv1.Role
	ShardsReaderBinding *rbacv1.RoleBinding
	APIService          *apiregv1.APIService
	ServiceMonitor      *unstructured.Unstructured
	PrometheusRule      *unstructured.Unstructured
}

// Objects lists the children in apply order: identity and configuration
// before the workloads that use them, the APIService last so that it is
// only registered once something can serve it.
func (d *Desired) Objects() []client.Object {
	out := []client.Object{d.ServiceAccount, d.ClusterRole, d.ClusterRoleBinding, d.ReaderClusterRole, d.AuthReaderBinding, d.ShardsReaderRole, d.ShardsReaderBinding,
		d.ConfigMap, d.CASecret, d.ServingSecret, d.ShardsService, d.FrontService}
	for _, s := range d.Shards {
		out = append(out, s)
	}
	for _, s := range d.ShardPDBs {
		out = append(out, s)
	}
	out = append(out, d.Front, d.FrontPDB)
	if d.ServiceMonitor != nil {
		out = append(out, d.ServiceMonitor)
	}
	if d.PrometheusRule != nil {
		out = append(out, d.PrometheusRule)
	}
	if d.APIService != nil {
		out = append(out, d.APIService)
	}
	return out
}

// BuildDesired builds every child of a profile. mon says which of the
// Prometheus Operator's CRDs are installed.
func BuildDesired(in *cachev1alpha1.CacheProfile, opts Options, certs Certificates, mon Monitoring) (*Desired, error) {
	p := WithDefaults(in)
	cm, err := BuildConfigMap(p, opts)
	if err != nil {
		return nil, err
	}
	d := &Desired{
		ServiceAccount:      BuildServiceAccount(p, opts),
		ConfigMap:           cm,
		CASecret:            BuildCASecret(p, opts, certs),
		ServingSecret:       BuildServingSecret(p, opts, certs),
		ShardsService:       BuildShardsService(p, opts),
		FrontService:        BuildFrontService(p, opts),
		ClusterRole:         BuildClusterRole(p),
		ClusterRoleBinding:  BuildClusterRoleBinding(p, opts),
		ReaderClusterRole:   BuildReaderClusterRole(p),
		AuthReaderBinding:   BuildAuthReaderBinding(p, opts),
		ShardsReaderRole:    BuildShardsReaderRole(p, opts),
		ShardsReaderBinding: BuildShardsReaderBinding(p, opts),
		FrontPDB:            BuildPDB(p, opts, frontName(p), ComponentFront, selectorLabels(p, ComponentFront)),
	}
	profileHash, err := shardConfigHash(p)
	if err != nil {
		return nil, err
	}
	for _, a := range AssignHashShards(p) {
		d.Shards = append(d.Shards, BuildShardStatefulSet(p, opts, a, profileHash))
		d.ShardPDBs = append(d.ShardPDBs, BuildPDB(p, opts, a.Name, ComponentShard, shardSelectorLabels(p, a.Index)))
	}
	frontHash, err := frontConfigHash(p, cm.Data[TopologyKey])
	if err != nil {
		return nil, err
	}
	d.Front = BuildFrontDeployment(p, opts, frontHash, hashBytes(certs.ServingCertPEM))
	if *p.Spec.Expose.APIService.Enabled {
		d.APIService = BuildAPIService(p, opts, certs.CABundle())
	}
	if mon.ServiceMonitor {
		d.ServiceMonitor = BuildServiceMonitor(p, opts)
	}
	if mon.PrometheusRule {
		if d.PrometheusRule, err = BuildPrometheusRule(p, opts); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func ownerRefs(p *cachev1alpha1.CacheProfile) []metav1.OwnerReference {
	return []metav1.OwnerReference{*metav1.NewControllerRef(p, cachev1alpha1.GroupVersion.WithKind("CacheProfile"))}
}

func objectMeta(p *cachev1alpha1.CacheProfile, namespace, name, component string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            name,
		Namespace:       namespace,
		Labels:          commonLabels(p, component),
		OwnerReferences: ownerRefs(p),
	}
}

// BuildServiceAccount is the identity of every cache-server pod of a profile.
func BuildServiceAccount(p *cachev1alpha1.CacheProfile, opts Options) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: objectMeta(p, opts.Namespace, serviceAccountName(p), ComponentAuth),
	}
}

// Topology is rendered into the ConfigMap for the front: which hash shards
// each shard serves and where its replicas answer (package topology, which
// the cache-server's front role reads).
type Topology = topology.Topology

// TopologyShard is one shard in the Topology.
type TopologyShard = topology.Shard

// BuildTopology addresses shard replicas by their stable StatefulSet DNS
// names (<pod>.<headless service>.<namespace>.svc), which exist for every
// replica whose pod has an address, ready or not (BuildShardsService).
func BuildTopology(p *cachev1alpha1.CacheProfile, opts Options) Topology {
	p = WithDefaults(p)
	t := Topology{HashShards: p.Spec.HashShards}
	for _, a := range AssignHashShards(p) {
		ts := TopologyShard{Name: a.Name, FirstHashShard: a.First, LastHashShard: a.Last, Replicas: p.Spec.ReplicasPerShard}
		for r := int32(0); r < p.Spec.ReplicasPerShard; r++ {
			ts.Endpoints = append(ts.Endpoints, fmt.Sprintf("%s-%d.%s.%s.svc:%d", a.Name, r, shardsServiceName(p), opts.Namespace, ShardPort))
		}
		t.Shards = append(t.Shards, ts)
	}
	return t
}

// BuildConfigMap renders the profile (the exact CacheProfile object the
// cache-server reads in standalone mode from a file) and the topology.
func BuildConfigMap(p *cachev1alpha1.CacheProfile, opts Options) (*corev1.ConfigMap, error) {
	p = WithDefaults(p)
	rendered := cachev1alpha1.CacheProfile{
		TypeMeta:   metav1.TypeMeta{APIVersion: cachev1alpha1.GroupVersion.String(), Kind: "CacheProfile"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name},
		Spec:       p.Spec,
	}
	profileYAML, err := yaml.Marshal(&rendered)
	if err != nil {
		return nil, fmt.Errorf("render profile: %w", err)
	}
	topoYAML, err := yaml.Marshal(BuildTopology(p, opts))
	if err != nil {
		return nil, fmt.Errorf("render topology: %w", err)
	}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: objectMeta(p, opts.Namespace, configMapName(p), ComponentShard),
		Data:       map[string]string{ProfileConfigKey: string(profileYAML), TopologyKey: string(topoYAML)},
	}, nil
}

// BuildCASecret holds the operator's CA. It is never mounted into pods: only
// the operator signs with it.
func BuildCASecret(p *cachev1alpha1.CacheProfile, opts Options, c Certificates) *corev1.Secret {
	data := map[string][]byte{"ca.crt": c.CACertPEM, "ca.key": c.CAKeyPEM}
	if len(c.PreviousCACertPEM) > 0 {
		data["ca-previous.crt"] = c.PreviousCACertPEM
	}
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: objectMeta(p, opts.Namespace, caSecretName(p), ComponentFront),
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
}

// BuildServingSecret is the fleet's serving certificate, mounted by fronts
// and shards. ca.crt is the CA bundle (the current CA and, during a
// rotation, the previous one): fronts verify the shards with it.
func BuildServingSecret(p *cachev1alpha1.CacheProfile, opts Options, c Certificates) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: objectMeta(p, opts.Namespace, servingSecretName(p), ComponentFront),
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       c.ServingCertPEM,
			corev1.TLSPrivateKeyKey: c.ServingKeyPEM,
			TLSCAKey:                c.CABundle(),
		},
	}
}

// ServingDNSNames are the names the aggregator (which dials
// <service>.<namespace>.svc) and in-cluster clients may use for the front,
// and the wildcard covering every shard replica's stable name
// (<pod>.<headless service>.<namespace>.svc, as in the topology), which the
// fronts dial.
func ServingDNSNames(p *cachev1alpha1.CacheProfile, opts Options) []string {
	svc := frontName(p)
	return []string{
		svc,
		svc + "." + opts.Namespace,
		svc + "." + opts.Namespace + ".svc",
		svc + "." + opts.Namespace + ".svc.cluster.local",
		"*." + shardsServiceName(p) + "." + opts.Namespace + ".svc",
	}
}

// tlsVolume mounts the serving Secret; fronts and shards mount it alike.
func tlsVolume(p *cachev1alpha1.CacheProfile) []corev1.Volume {
	return []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: servingSecretName(p)}}}}
}

func tlsVolumeMounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{{Name: "tls", MountPath: TLSMountPath, ReadOnly: true}}
}

// BuildShardsService is the headless Service giving each shard replica a
// stable DNS name (the StatefulSets' serviceName). It publishes replicas
// before they are ready: cluster DNS has no name for an unready endpoint,
// and a front that looked one up while its shard was starting got an
// NXDOMAIN that CoreDNS caches for 30 s (kubeadm's `cache 30`) — on a real
// node the first rollout waited ~30 s after the shards were ready. A
// replica that is up but still loading answers 429 and the front tries
// another (fleet.Client).
func BuildShardsService(p *cachev1alpha1.CacheProfile, opts Options) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: objectMeta(p, opts.Namespace, shardsServiceName(p), ComponentShard),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 selectorLabels(p, ComponentShard),
			Ports: []corev1.ServicePort{
				{Name: "shard", Port: ShardPort, TargetPort: intstr.FromString("shard"), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: MetricsPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// BuildFrontService is the Service the APIService points at.
func BuildFrontService(p *cachev1alpha1.CacheProfile, opts Options) *corev1.Service {
	p = WithDefaults(p)
	m := objectMeta(p, opts.Namespace, frontName(p), ComponentFront)
	if len(p.Spec.Expose.Service.Annotations) > 0 {
		m.Annotations = mergeLabels(p.Spec.Expose.Service.Annotations)
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: m,
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: p.Spec.Expose.Service.ClusterIP,
			Selector:  selectorLabels(p, ComponentFront),
			Ports: []corev1.ServicePort{
				{Name: "https", Port: p.Spec.Expose.Service.Port, TargetPort: intstr.FromString("https"), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", Port: MetricsPort, TargetPort: intstr.FromString("metrics"), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// podSecurityContext and containerSecurityContext satisfy the "restricted"
// Pod Security Standard: the cache-server needs no privileges at all.
func podSecurityContext() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func containerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

func probe(path string) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("metrics")}},
		PeriodSeconds:    10,
		FailureThreshold: 3,
	}
}

// podSpec is shared by shards and front; podLabels select the pod's own
// replica set (one shard's pods, or the fronts), which placement spreads
// over nodes.
func podSpec(p *cachev1alpha1.CacheProfile, opts Options, podLabels map[string]string, c corev1.Container, volumes []corev1.Volume) corev1.PodSpec {
	image := p.Spec.Image
	if image == "" {
		image = opts.DefaultImage
	}
	c.Image = image
	c.ImagePullPolicy = corev1.PullIfNotPresent
	c.Resources = *p.Spec.PodResources.DeepCopy()
	c.SecurityContext = containerSecurityContext()
	c.ReadinessProbe = probe("/readyz")
	c.LivenessProbe = probe("/livez")
	c.VolumeMounts = append([]corev1.VolumeMount{{Name: "config", MountPath: ConfigMountPath, ReadOnly: true}}, c.VolumeMounts...)
	sched := p.Spec.Scheduling.DeepCopy()
	tolerations, spread := placement(*sched, podLabels)
	return corev1.PodSpec{
		ServiceAccountName:            serviceAccountName(p),
		AutomountServiceAccountToken:  ptr.To(true), // the cache-server talks to the apiserver
		SecurityContext:               podSecurityContext(),
		TerminationGracePeriodSeconds: ptr.To[int64](30),
		Containers:                    []corev1.Container{c},
		Volumes: append([]corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(p)}},
		}}}, volumes...),
		NodeSelector:              sched.NodeSelector,
		Tolerations:               tolerations,
		Affinity:                  sched.Affinity,
		TopologySpreadConstraints: spread,
		PriorityClassName:         sched.PriorityClassName,
	}
}

// BuildShardStatefulSet builds one shard. The pods learn their hash shards
// from the --hash-shards flag; profileHash (of the rendered profile only, not
// the topology) restarts them when what they ingest changes, but not when
// only the front's view of the fleet changes. They serve HTTPS with the
// fleet's serving certificate, which they re-read when the kubelet updates
// the mounted Secret: a rotation must not restart them (a restarted shard
// reloads its whole slice), so unlike the front they carry no certificate
// hash.
func BuildShardStatefulSet(p *cachev1alpha1.CacheProfile, opts Options, a ShardAssignment, profileHash string) *appsv1.StatefulSet {
	p = WithDefaults(p)
	podLabels := mergeLabels(commonLabels(p, ComponentShard), shardSelectorLabels(p, a.Index))
	c := corev1.Container{
		Name:    "cache-server",
		Command: []string{CacheServerBinary},
		// The role is the cache-server's subcommand, as in
		// `cache-server standalone`; see docs/operator.md for the contract.
		Args: []string{
			"shard",
			"--profile=" + ConfigMountPath + "/" + ProfileConfigKey,
			"--shard-name=" + a.Name,
			fmt.Sprintf("--hash-shards=%s", a.HashShardRange()),
			fmt.Sprintf("--listen=0.0.0.0:%d", ShardPort),
			fmt.Sprintf("--metrics-listen=0.0.0.0:%d", MetricsPort),
			"--tls-cert-file=" + TLSMountPath + "/" + corev1.TLSCertKey,
			"--tls-private-key-file=" + TLSMountPath + "/" + corev1.TLSPrivateKeyKey,
		},
		Ports: []corev1.ContainerPort{
			{Name: "shard", ContainerPort: ShardPort, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
		},
		VolumeMounts: tlsVolumeMounts(),
	}
	m := objectMeta(p, opts.Namespace, a.Name, ComponentShard)
	m.Labels[LabelShard] = fmt.Sprint(a.Index)
	return &appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: m,
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(p.Spec.ReplicasPerShard),
			ServiceName: shardsServiceName(p),
			Selector:    &metav1.LabelSelector{MatchLabels: shardSelectorLabels(p, a.Index)},
			// Replicas of a shard are independent copies; ordered start
			// would only slow down recovery.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			UpdateStrategy:      appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: map[string]string{AnnotationConfigHash: profileHash}},
				Spec:       podSpec(p, opts, shardSelectorLabels(p, a.Index), c, tlsVolume(p)),
			},
		},
	}
}

// FrontShutdownDelaySeconds is how long a terminating front keeps serving
// before it is signalled (inside the 30 s grace period, with the 5 s of
// graceful shutdown after it).
//
// Why 15 s: kube-aggregator reaches fronts through the Service's ClusterIP,
// so a deleted front must keep its listener open until every kube-proxy —
// the one on kube-apiserver's host included — has dropped it from the
// Service. The aggregator's availability check and its new connections
// dial the ClusterIP; one that lands on a front whose listener closed is a
// 503 the client does not retry (no Retry-After). On a loaded 2-core CI
// machine running three nodes, 5 s was not always enough: one read of a
// drain failed that way.
const FrontShutdownDelaySeconds = 15

// BuildFrontDeployment builds the front: the aggregated API server. It
// calls the shards over TLS, verifying them with the serving Secret's CA
// bundle (--shard-ca-file), and restarts when its certificate rotates.
func BuildFrontDeployment(p *cachev1alpha1.CacheProfile, opts Options, configHash, certHash string) *appsv1.Deployment {
	p = WithDefaults(p)
	c := corev1.Container{
		Name:    "cache-server",
		Command: []string{CacheServerBinary},
		Args: []string{
			"front",
			"--profile=" + ConfigMountPath + "/" + ProfileConfigKey,
			"--topology=" + ConfigMountPath + "/" + TopologyKey,
			"--api-group=" + APIGroup(p),
			fmt.Sprintf("--listen=0.0.0.0:%d", FrontPort),
			"--tls-cert-file=" + TLSMountPath + "/" + corev1.TLSCertKey,
			"--tls-private-key-file=" + TLSMountPath + "/" + corev1.TLSPrivateKeyKey,
			"--shard-ca-file=" + TLSMountPath + "/" + TLSCAKey,
			// Replicas' addresses from the shards' EndpointSlices, not
			// cluster DNS (BuildShardsReaderRole says why).
			"--shard-addresses-from=" + opts.Namespace + "/" + shardsServiceName(p),
			fmt.Sprintf("--metrics-listen=0.0.0.0:%d", MetricsPort),
		},
		Ports: []corev1.ContainerPort{
			{Name: "https", ContainerPort: FrontPort, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP},
		},
		VolumeMounts: tlsVolumeMounts(),
		// A front whose pod is being deleted keeps serving a few seconds
		// before its SIGTERM: kube-proxy and the aggregator route new
		// requests to it until the EndpointSlice change reaches them
		// (kube-apiserver's own answer is --shutdown-delay-duration). On
		// a real node, reads during a front rollout got the aggregator's
		// 503 without it.
		Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: FrontShutdownDelaySeconds}}},
	}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: objectMeta(p, opts.Namespace, frontName(p), ComponentFront),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(p.Spec.FrontReplicas),
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(p, ComponentFront)},
			// Never drop below the desired count while rolling: the front is
			// every client's entry point.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptr.To(intstr.FromInt32(0)),
				MaxSurge:       ptr.To(intstr.FromInt32(1)),
			}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      commonLabels(p, ComponentFront),
					Annotations: map[string]string{AnnotationConfigHash: configHash, AnnotationCertHash: certHash},
				},
				Spec: podSpec(p, opts, selectorLabels(p, ComponentFront), c, tlsVolume(p)),
			},
		},
	}
}

// BuildPDB allows voluntary disruption (an eviction: kubectl drain, a
// cluster autoscaler) of one pod at a time per shard and for the front, and
// only while the others are ready: with two or more replicas a drain never
// takes a shard's last ready replica; it waits, retrying, until the
// replacement of the previous one is ready.
//
// With one replica (replicasPerShard or frontReplicas 1) there is nothing
// to keep: maxUnavailable 1 lets the drain evict the only pod, and its
// hash shards are unserved (reads of them wait, then answer 504) until the
// replacement on another node has loaded them. A budget that protected it
// (minAvailable 1) would make every drain of its node hang until someone
// deletes the pod by hand, which is the same gap, later. Profiles that
// must not have the gap run two replicas.
//
// Unhealthy pods may always be evicted (unhealthyPodEvictionPolicy
// AlwaysAllow): a replica that never turns ready (a crash loop, a node
// without the image) protects nothing, and under the default policy it
// would block every drain of its node for as long as it is broken.
func BuildPDB(p *cachev1alpha1.CacheProfile, opts Options, name, component string, selector map[string]string) *policyv1.PodDisruptionBudget {
	m := objectMeta(p, opts.Namespace, name, component)
	if v, ok := selector[LabelShard]; ok {
		m.Labels[LabelShard] = v
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: m,
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: selector},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
}

// BuildClusterRole grants exactly what the cache-server needs: read the
// cached resources, plus the namespaces when a namespace selector has to be
// evaluated, delegate authentication and authorization of its clients,
// read the cluster's priority-and-fairness configuration, and
// call the shards (fronts present the fleet's ServiceAccount token; shards
// authorize every call as get on a /shard/v1/ non-resource URL, so only this
// ServiceAccount, or a cluster admin, reads a shard directly).
func BuildClusterRole(p *cachev1alpha1.CacheProfile) *rbacv1.ClusterRole {
	byGroup := map[string][]string{}
	needNamespaces := false
	for _, r := range p.Spec.Resources {
		byGroup[r.Group] = append(byGroup[r.Group], r.Resource)
		if r.NamespaceSelector != nil {
			needNamespaces = true
		}
	}
	if needNamespaces && !contains(byGroup[""], "namespaces") {
		byGroup[""] = append(byGroup[""], "namespaces")
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	var rules []rbacv1.PolicyRule
	for _, g := range groups {
		res := append([]string{}, byGroup[g]...)
		sort.Strings(res)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: res, Verbs: []string{"get", "list", "watch"}})
	}
	// The cache-server reads the CustomResourceDefinition of every cached
	// resource of a named group (for its selectableFields; for built-in
	// groups the read finds nothing), and only those; it watches them (a
	// list and watch with a metadata.name field selector, which RBAC
	// authorizes by resourceNames) to keep Table printer columns current.
	var crds []string
	for _, r := range p.Spec.Resources {
		if r.Group != "" {
			crds = append(crds, r.Resource+"."+r.Group)
		}
	}
	if len(crds) > 0 {
		sort.Strings(crds)
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, ResourceNames: crds, Verbs: []string{"get", "list", "watch"}})
	}
	rules = append(rules,
		rbacv1.PolicyRule{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		rbacv1.PolicyRule{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		// Priority and fairness on the fronts reads the cluster's
		// configuration. Not the write of FlowSchema status its config
		// controller also attempts: kube-apiserver writes the same
		// condition (docs/priority-and-fairness.md).
		rbacv1.PolicyRule{APIGroups: []string{"flowcontrol.apiserver.k8s.io"}, Resources: []string{"flowschemas", "prioritylevelconfigurations"}, Verbs: []string{"list", "watch"}},
		rbacv1.PolicyRule{NonResourceURLs: []string{ShardNonResourceURLs}, Verbs: []string{"get"}},
	)
	m := objectMeta(p, "", clusterRoleName(p), ComponentAuth)
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: m,
		Rules:      rules,
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// BuildClusterRoleBinding binds the ClusterRole to the profile's ServiceAccount.
func BuildClusterRoleBinding(p *cachev1alpha1.CacheProfile, opts Options) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: objectMeta(p, "", clusterRoleName(p), ComponentAuth),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRoleName(p)},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccountName(p), Namespace: opts.Namespace}},
	}
}

// BuildReaderClusterRole lets its holders send requests through the
// profile's aggregated paths. kube-apiserver authorizes such a request as
// the path it sees (verb watch on resource "api" or "apis" of the profile's
// group below status.serverURL; get or list below the group-version's own
// path, which older kubeconfigs use), not as what is read; the tier then
// authorizes the real read with a SubjectAccessReview as the caller. So this
// role opens the door, never what is behind it, and is aggregated into view
// (and edit and admin): whoever may view the cluster may read through the
// tier exactly what they may read from the apiserver. A namespaced
// RoleBinding does not help: the apiserver sees every request through the
// tier as cluster-scoped; bind this ClusterRole with a ClusterRoleBinding.
func BuildReaderClusterRole(p *cachev1alpha1.CacheProfile) *rbacv1.ClusterRole {
	m := objectMeta(p, "", readerClusterRoleName(p), ComponentAuth)
	// Picked up by kube-controller-manager's clusterrole-aggregation
	// controller into view, edit and admin, as the bootstrap
	// system:aggregate-to-view role's rules are.
	for _, role := range []string{"view", "edit", "admin"} {
		m.Labels["rbac.authorization.k8s.io/aggregate-to-"+role] = "true"
	}
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: m,
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{APIGroup(p)}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}},
	}
}

// BuildAuthReaderBinding lets the front read the request-header CA that
// authenticates the aggregator's proxied requests.
func BuildAuthReaderBinding(p *cachev1alpha1.CacheProfile, opts Options) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: objectMeta(p, AuthReaderNamespace, authReaderBindingName(p), ComponentAuth),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: AuthReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccountName(p), Namespace: opts.Namespace}},
	}
}

// BuildShardsReaderRole lets the fronts read the EndpointSlices of their
// own namespace — where the shards' headless Service's say each replica's
// current address (--shard-addresses-from): cluster DNS, whose cache lags
// a replaced pod by its TTL (30 s with kubeadm's CoreDNS), left a shard
// unreachable from the fronts while both its replicas were Ready. The
// namespace only, and EndpointSlices only.
func BuildShardsReaderRole(p *cachev1alpha1.CacheProfile, opts Options) *rbacv1.Role {
	return &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: objectMeta(p, opts.Namespace, shardsReaderName(p), ComponentAuth),
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}},
	}
}

// BuildShardsReaderBinding binds BuildShardsReaderRole to the profile's
// ServiceAccount.
func BuildShardsReaderBinding(p *cachev1alpha1.CacheProfile, opts Options) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: objectMeta(p, opts.Namespace, shardsReaderName(p), ComponentAuth),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: shardsReaderName(p)},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccountName(p), Namespace: opts.Namespace}},
	}
}

// BuildAPIService registers the front for the profile's group, trusting the
// operator's CA (and the previous one during a rotation).
func BuildAPIService(p *cachev1alpha1.CacheProfile, opts Options, caBundle []byte) *apiregv1.APIService {
	p = WithDefaults(p)
	return &apiregv1.APIService{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiregistration.k8s.io/v1", Kind: "APIService"},
		ObjectMeta: objectMeta(p, "", APIServiceName(p), ComponentFront),
		Spec: apiregv1.APIServiceSpec{
			Service:              &apiregv1.ServiceReference{Namespace: opts.Namespace, Name: frontName(p), Port: ptr.To(p.Spec.Expose.Service.Port)},
			Group:                APIGroup(p),
			Version:              cachev1alpha1.AggregatedAPIVersion,
			CABundle:             caBundle,
			GroupPriorityMinimum: p.Spec.Expose.APIService.GroupPriorityMinimum,
			VersionPriority:      p.Spec.Expose.APIService.VersionPriority,
		},
	}
}

// The Prometheus Operator's kind; it is built as unstructured so the
// operator does not depend on its Go module.
const (
	serviceMonitorAPIVersion = "monitoring.coreos.com/v1"
	serviceMonitorKind       = "ServiceMonitor"
)

// BuildServiceMonitor scrapes the metrics port of the shards and the front
// (both Services carry the profile's instance label).
func BuildServiceMonitor(p *cachev1alpha1.CacheProfile, opts Options) *unstructured.Unstructured {
	labels := map[string]any{}
	for k, v := range commonLabels(p, ComponentFront) {
		labels[k] = v
	}
	refs := []any{}
	for _, r := range ownerRefs(p) {
		refs = append(refs, map[string]any{
			"apiVersion": r.APIVersion, "kind": r.Kind, "name": r.Name, "uid": string(r.UID),
			"controller": true, "blockOwnerDeletion": true,
		})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": serviceMonitorAPIVersion,
		"kind":       serviceMonitorKind,
		"metadata": map[string]any{
			"name": p.Name, "namespace": opts.Namespace, "labels": labels, "ownerReferences": refs,
		},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{
				LabelInstance: p.Name, LabelManagedBy: ManagedByValue, LabelName: AppName,
			}},
			"endpoints": []any{map[string]any{"port": "metrics", "path": "/metrics", "interval": "30s"}},
		},
	}}
}

// shardServed is what a shard acts on in the rendered profile (the fields
// the cache-server reads: what it ingests, how long reads wait, how much
// history it keeps), so that e.g. scaling the front does not restart every
// shard and make it reload its whole slice from the apiserver.
type shardServed struct {
	Resources        []cachev1alpha1.CachedResource
	HashShards       int32
	FreshnessTimeout *metav1.Duration
	HistoryWindow    *metav1.Duration
}

func servedByShards(p *cachev1alpha1.CacheProfile) shardServed {
	return shardServed{p.Spec.Resources, p.Spec.HashShards, p.Spec.FreshnessTimeout, p.Spec.HistoryWindow}
}

func shardConfigHash(p *cachev1alpha1.CacheProfile) (string, error) {
	b, err := json.Marshal(servedByShards(p))
	return hashBytes(b), err
}

// frontConfigHash covers what a front acts on: what the shards serve, its
// priority-and-fairness seats and the topology. The rest of the rendered
// profile (replica counts, the APIService's priority, monitoring) reaches
// the fronts through their own fields or not at all: hashing it restarted
// every front when, say, only groupPriorityMinimum changed, and a rollout
// that must wait for a front on a lost node.
func frontConfigHash(p *cachev1alpha1.CacheProfile, topologyYAML string) (string, error) {
	b, err := json.Marshal(struct {
		Shard                  shardServed
		ServerConcurrencyLimit *int32
		Topology               string
	}{servedByShards(p), p.Spec.ServerConcurrencyLimit, topologyYAML})
	return hashBytes(b), err
}

func hashBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

func mustDuration(s string) *metav1.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(fmt.Sprintf("bad built-in default duration %q: %v", s, err))
	}
	return &metav1.Duration{Duration: d}
}

package controllers

import (
	"crypto/rand"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

var testOpts = Options{Namespace: "cachetier-system", DefaultImage: "example.com/cache-server:v1", APIServerURL: "https://api.example.com:6443/"}

func testProfile() *cachev1alpha1.CacheProfile {
	return &cachev1alpha1.CacheProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet", UID: types.UID("uid-1"), Generation: 3},
		Spec: cachev1alpha1.CacheProfileSpec{
			Resources: []cachev1alpha1.CachedResource{
				{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}},
				{Version: "v1", Resource: "configmaps", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}},
				{Group: "apps", Version: "v1", Resource: "deployments"},
				{Group: "apps", Version: "v1", Resource: "replicasets"},
			},
			HashShards: 10, Shards: 3, ReplicasPerShard: 2, FrontReplicas: 2,
			PodResources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
		},
	}
}

func testCerts(t *testing.T, p *cachev1alpha1.CacheProfile) Certificates {
	t.Helper()
	c, _, err := EnsureCertificates(rand.Reader, time.Now(), Certificates{}, ServingDNSNames(p, testOpts))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAssignHashShards(t *testing.T) {
	for _, tc := range []struct {
		h, s int32
		want []string
	}{
		{16, 1, []string{"0-15"}},
		{16, 2, []string{"0-7", "8-15"}},
		{10, 3, []string{"0-3", "4-6", "7-9"}},
		{4, 4, []string{"0-0", "1-1", "2-2", "3-3"}},
	} {
		p := testProfile()
		p.Spec.HashShards, p.Spec.Shards = tc.h, tc.s
		var got []string
		for i, a := range AssignHashShards(p) {
			if a.Index != i || a.Name != shardName(p, i) {
				t.Errorf("assignment %d named %q index %d", i, a.Name, a.Index)
			}
			got = append(got, a.HashShardRange())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("AssignHashShards(%d,%d) = %v, want %v", tc.h, tc.s, got, tc.want)
		}
	}
}

func TestWithDefaultsFillsSchemaDefaults(t *testing.T) {
	p := WithDefaults(&cachev1alpha1.CacheProfile{})
	s := p.Spec
	if s.HashShards != 16 || s.Shards != 2 || s.ReplicasPerShard != 2 || s.FrontReplicas != 2 ||
		s.FreshnessTimeout.Duration != 3*time.Second || s.HistoryWindow.Duration != 150*time.Second ||
		!*s.Expose.APIService.Enabled || s.Expose.Service.Port != 443 || s.Expose.APIService.GroupPriorityMinimum != 1000 {
		t.Fatalf("defaults not applied: %+v", s)
	}
	in := testProfile()
	in.Spec.Expose.APIService.Enabled = ptr.To(false)
	if out := WithDefaults(in); *out.Spec.Expose.APIService.Enabled || out.Spec.Shards != 3 {
		t.Fatalf("explicit values overwritten: %+v", out.Spec)
	}
	if in.Spec.FreshnessTimeout != nil {
		t.Fatal("WithDefaults mutated its input")
	}
}

func TestBuildDesiredShapes(t *testing.T) {
	p := testProfile()
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{})
	if err != nil {
		t.Fatal(err)
	}
	if d.ServiceMonitor != nil {
		t.Error("ServiceMonitor built without the CRD")
	}
	if len(d.Shards) != 3 || len(d.ShardPDBs) != 3 {
		t.Fatalf("want 3 shards and PDBs, got %d/%d", len(d.Shards), len(d.ShardPDBs))
	}
	for _, o := range d.Objects() {
		if o.GetLabels()[LabelProfile] != "fleet" || o.GetLabels()[LabelManagedBy] != ManagedByValue {
			t.Errorf("%T %s lacks the profile/managed-by labels: %v", o, o.GetName(), o.GetLabels())
		}
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != "uid-1" || !*refs[0].Controller || refs[0].Kind != "CacheProfile" {
			t.Errorf("%T %s owner references: %+v", o, o.GetName(), refs)
		}
		if errs := validation.IsDNS1123Subdomain(o.GetName()); len(errs) > 0 && !strings.HasPrefix(o.GetName(), "cachetier:") {
			t.Errorf("%s: %v", o.GetName(), errs)
		}
		if o.GetObjectKind().GroupVersionKind().Kind == "" {
			t.Errorf("%T %s has no kind", o, o.GetName())
		}
	}
	// Shard 1 of 3 over 10 hash shards serves 4-6, and its pods say so.
	s1 := d.Shards[1]
	if s1.Name != "fleet-shard-1" || s1.Namespace != "cachetier-system" || *s1.Spec.Replicas != 2 || s1.Spec.ServiceName != "fleet-shards" {
		t.Errorf("shard 1 meta/spec: %s/%s replicas %d service %s", s1.Namespace, s1.Name, *s1.Spec.Replicas, s1.Spec.ServiceName)
	}
	c := s1.Spec.Template.Spec.Containers[0]
	wantArgs := []string{
		"shard",
		"--profile=/etc/cachetier/config/cacheprofile.yaml",
		"--shard-name=fleet-shard-1",
		"--hash-shards=4-6",
		"--listen=0.0.0.0:8444",
		"--metrics-listen=0.0.0.0:9090",
		"--tls-cert-file=/etc/cachetier/tls/tls.crt",
		"--tls-private-key-file=/etc/cachetier/tls/tls.key",
	}
	if !slices.Equal(c.Args, wantArgs) || !slices.Equal(c.Command, []string{"/cache-server"}) {
		t.Errorf("shard 1 args: %v\nwant %v", c.Args, wantArgs)
	}
	if c.Image != testOpts.DefaultImage || c.Resources.Requests.Memory().String() != "1Gi" {
		t.Errorf("shard image/resources: %s %v", c.Image, c.Resources)
	}
	if !*c.SecurityContext.ReadOnlyRootFilesystem || !*s1.Spec.Template.Spec.SecurityContext.RunAsNonRoot {
		t.Error("shard pods must be non-root with a read-only root filesystem")
	}
	if got := s1.Spec.Selector.MatchLabels[LabelShard]; got != "1" {
		t.Errorf("shard selector: %v", s1.Spec.Selector.MatchLabels)
	}
	for k, v := range s1.Spec.Selector.MatchLabels {
		if s1.Spec.Template.Labels[k] != v {
			t.Errorf("pod template lacks selector label %s=%s", k, v)
		}
	}
	if hostnameSpread(s1.Spec.Template.Spec) == nil {
		t.Error("default spread over nodes missing")
	}
	if pdb := d.ShardPDBs[1]; pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.Selector.MatchLabels[LabelShard] != "1" {
		t.Errorf("shard PDB: %+v", pdb.Spec)
	}
	if d.FrontPDB.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("front PDB: %+v", d.FrontPDB.Spec)
	}

	f := d.Front
	if *f.Spec.Replicas != 2 || f.Spec.Template.Spec.ServiceAccountName != "fleet-cache-server" {
		t.Errorf("front: replicas %d sa %s", *f.Spec.Replicas, f.Spec.Template.Spec.ServiceAccountName)
	}
	if !slices.Contains(f.Spec.Template.Spec.Containers[0].Args, "--api-group=fleet.cache.cachetier.io") {
		t.Errorf("front args: %v", f.Spec.Template.Spec.Containers[0].Args)
	}
	if f.Spec.Template.Annotations[AnnotationCertHash] == "" || f.Spec.Template.Annotations[AnnotationConfigHash] == "" {
		t.Error("front pod template must carry config and certificate hashes")
	}
	if !slices.Contains(f.Spec.Template.Spec.Containers[0].Args, "--shard-ca-file=/etc/cachetier/tls/ca.crt") {
		t.Errorf("front args lack --shard-ca-file: %v", f.Spec.Template.Spec.Containers[0].Args)
	}
	// Shards mount the serving Secret exactly like the front, and carry no
	// certificate hash: they re-read the files, a restart drops the cache.
	fs, ss := f.Spec.Template.Spec, s1.Spec.Template.Spec
	if !equality.Semantic.DeepEqual(fs.Volumes, ss.Volumes) || !equality.Semantic.DeepEqual(fs.Containers[0].VolumeMounts, ss.Containers[0].VolumeMounts) {
		t.Errorf("shard volumes %+v / mounts %+v differ from the front's %+v / %+v", ss.Volumes, ss.Containers[0].VolumeMounts, fs.Volumes, fs.Containers[0].VolumeMounts)
	}
	if len(ss.Volumes) != 2 || ss.Volumes[1].Name != "tls" || ss.Volumes[1].Secret == nil || ss.Volumes[1].Secret.SecretName != "fleet-serving-cert" ||
		!slices.ContainsFunc(ss.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
			return equality.Semantic.DeepEqual(m, corev1.VolumeMount{Name: "tls", MountPath: "/etc/cachetier/tls", ReadOnly: true})
		}) {
		t.Errorf("shard TLS volume: %+v mounts %+v", ss.Volumes, ss.Containers[0].VolumeMounts)
	}
	if _, ok := s1.Spec.Template.Annotations[AnnotationCertHash]; ok || s1.Spec.Template.Annotations[AnnotationConfigHash] == "" {
		t.Errorf("shard pod template annotations: %v", s1.Spec.Template.Annotations)
	}

	if l := d.Front.Spec.Template.Spec.Containers[0].Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || l.PreStop.Sleep.Seconds != FrontShutdownDelaySeconds {
		t.Errorf("a terminating front must keep serving until its endpoint is gone: lifecycle %+v", l)
	}
	if !d.ShardsService.Spec.PublishNotReadyAddresses {
		t.Error("shards Service must publish unready replicas: their DNS names would be NXDOMAIN (and cached) while they start")
	}
	if d.ShardsService.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Error("shards service must be headless")
	}
	if d.FrontService.Spec.Ports[0].Port != 443 || d.FrontService.Spec.Selector[LabelComponent] != ComponentFront {
		t.Errorf("front service: %+v", d.FrontService.Spec)
	}

	a := d.APIService
	if a == nil || a.Name != "v1alpha1.fleet.cache.cachetier.io" || a.Spec.Group != "fleet.cache.cachetier.io" || a.Spec.Version != "v1alpha1" ||
		a.Spec.Service.Name != "fleet-front" || a.Spec.Service.Namespace != "cachetier-system" || *a.Spec.Service.Port != 443 ||
		string(a.Spec.CABundle) != string(d.ServingSecret.Data["ca.crt"]) || a.Spec.InsecureSkipTLSVerify {
		t.Errorf("APIService: %+v", a)
	}
	if d.ServingSecret.Type != corev1.SecretTypeTLS || len(d.ServingSecret.Data["tls.key"]) == 0 || d.CASecret.Data["ca.key"] == nil {
		t.Error("secrets incomplete")
	}
	if _, ok := d.ServingSecret.Data["ca.key"]; ok {
		t.Error("the CA key must not be in the mounted serving secret")
	}
}

func TestBuildDesiredOptionalParts(t *testing.T) {
	p := testProfile()
	p.Spec.Expose.APIService.Enabled = ptr.To(false)
	p.Spec.Image = "example.com/custom:v2"
	p.Spec.Scheduling = cachev1alpha1.Scheduling{
		NodeSelector:              map[string]string{"pool": "cache"},
		Tolerations:               []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "cache", Effect: corev1.TaintEffectNoSchedule}},
		Affinity:                  &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}},
		TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway}},
		PriorityClassName:         "high",
	}
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{ServiceMonitor: true, PrometheusRule: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.APIService != nil {
		t.Error("APIService built although disabled")
	}
	if d.ServiceMonitor == nil || d.ServiceMonitor.GetKind() != "ServiceMonitor" || d.ServiceMonitor.GetNamespace() != "cachetier-system" {
		t.Fatalf("ServiceMonitor: %v", d.ServiceMonitor)
	}
	for _, spec := range []corev1.PodSpec{d.Shards[0].Spec.Template.Spec, d.Front.Spec.Template.Spec} {
		// The profile's scheduling, with the operator's node-loss
		// tolerations and spread over nodes after it (placement.go).
		if spec.NodeSelector["pool"] != "cache" || len(spec.Tolerations) != 3 || spec.Tolerations[0].Key != "dedicated" || spec.Affinity.NodeAffinity == nil ||
			spec.Affinity.PodAntiAffinity != nil || len(spec.TopologySpreadConstraints) != 2 ||
			spec.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" || spec.PriorityClassName != "high" {
			t.Errorf("scheduling not copied: %+v", spec)
		}
		if spec.Containers[0].Image != "example.com/custom:v2" {
			t.Errorf("image: %s", spec.Containers[0].Image)
		}
	}
}

func TestBuildClusterRoleIsExactlyReadPlusDelegation(t *testing.T) {
	cr := BuildClusterRole(testProfile())
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "namespaces", "pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replicasets"}, Verbs: []string{"get", "list", "watch"}},
		// The catalog looks for a CRD of each grouped resource, the Table
		// printer watches it: those names only.
		{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, ResourceNames: []string{"deployments.apps", "replicasets.apps"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		// Priority and fairness reads the cluster's configuration; it is
		// denied the FlowSchema status write on purpose.
		{APIGroups: []string{"flowcontrol.apiserver.k8s.io"}, Resources: []string{"flowschemas", "prioritylevelconfigurations"}, Verbs: []string{"list", "watch"}},
		{NonResourceURLs: []string{"/shard/v1/*"}, Verbs: []string{"get"}},
	}
	got, _ := yaml.Marshal(cr.Rules)
	exp, _ := yaml.Marshal(want)
	if string(got) != string(exp) {
		t.Errorf("rules:\n%s\nwant:\n%s", got, exp)
	}
	// Without a namespace selector, namespaces are not readable.
	p := testProfile()
	p.Spec.Resources = p.Spec.Resources[:1]
	if rules := BuildClusterRole(p).Rules; !slices.Equal(rules[0].Resources, []string{"pods"}) {
		t.Errorf("rules without namespace selector: %+v", rules)
	}
	crb, rb := BuildClusterRoleBinding(p, testOpts), BuildAuthReaderBinding(p, testOpts)
	if crb.RoleRef.Name != cr.Name || crb.Subjects[0].Name != "fleet-cache-server" || crb.Subjects[0].Namespace != "cachetier-system" {
		t.Errorf("cluster role binding: %+v", crb)
	}
	if rb.Namespace != "kube-system" || rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != "extension-apiserver-authentication-reader" || rb.Subjects[0].Name != "fleet-cache-server" {
		t.Errorf("auth reader binding: %+v", rb)
	}
}

func TestBuildConfigMapRendersProfileAndTopology(t *testing.T) {
	p := testProfile()
	cm, err := BuildConfigMap(p, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	var rendered cachev1alpha1.CacheProfile
	if err := yaml.UnmarshalStrict([]byte(cm.Data[ProfileConfigKey]), &rendered); err != nil {
		t.Fatal(err)
	}
	if rendered.Kind != "CacheProfile" || rendered.Name != "fleet" || rendered.Spec.HashShards != 10 ||
		len(rendered.Spec.Resources) != 4 || rendered.Spec.Resources[0].FieldIndexes[0] != "spec.nodeName" ||
		rendered.Spec.FreshnessTimeout.Duration != 3*time.Second {
		t.Errorf("rendered profile: %+v", rendered)
	}
	var topo Topology
	if err := yaml.UnmarshalStrict([]byte(cm.Data[TopologyKey]), &topo); err != nil {
		t.Fatal(err)
	}
	if topo.HashShards != 10 || len(topo.Shards) != 3 || topo.Shards[2].FirstHashShard != 7 || topo.Shards[2].LastHashShard != 9 ||
		topo.Shards[2].Endpoints[1] != "fleet-shard-2-1.fleet-shards.cachetier-system.svc:8444" {
		t.Errorf("topology: %+v", topo)
	}
}

// The shard pods restart when what they ingest changes, not when only the
// front's view changes; the front restarts on both, and on nothing else
// in the rendered profile.
func TestConfigHashesScopeRestarts(t *testing.T) {
	certs := testCerts(t, testProfile())
	build := func(mut func(*cachev1alpha1.CacheProfile)) *Desired {
		p := testProfile()
		mut(p)
		d, err := BuildDesired(p, testOpts, certs, Monitoring{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := build(func(*cachev1alpha1.CacheProfile) {})
	front := build(func(p *cachev1alpha1.CacheProfile) { p.Spec.FrontReplicas = 5 })
	ingest := build(func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources[0].FieldIndexes = nil })
	h := func(d *Desired) (string, string) {
		return d.Shards[0].Spec.Template.Annotations[AnnotationConfigHash], d.Front.Spec.Template.Annotations[AnnotationConfigHash]
	}
	bs, bf := h(base)
	fs, _ := h(front)
	is, ifr := h(ingest)
	if bs != fs {
		t.Error("changing frontReplicas must not restart shards")
	}
	if _, ff := h(front); ff != bf {
		t.Error("changing frontReplicas must not restart the fronts (the Deployment scales)")
	}
	// The APIService's priority is the aggregator's business: the e2e/nodes
	// test changes it while a front's node is lost, and a front rollout
	// then waited for that node.
	expose := build(func(p *cachev1alpha1.CacheProfile) { p.Spec.Expose.APIService.GroupPriorityMinimum += 100 })
	if es, ef := h(expose); es != bs || ef != bf {
		t.Error("changing the APIService's groupPriorityMinimum must restart nothing")
	}
	if expose.ConfigMap.Data[ProfileConfigKey] == base.ConfigMap.Data[ProfileConfigKey] {
		t.Error("the rendered profile must still carry the whole spec")
	}
	if bs == is || bf == ifr {
		t.Error("changing what is ingested must restart shards and front")
	}
	// The fronts' priority-and-fairness seats reach them in the rendered
	// profile: a change restarts the fronts, not the shards.
	seats := build(func(p *cachev1alpha1.CacheProfile) { p.Spec.ServerConcurrencyLimit = ptr.To[int32](300) })
	if ss, sf := h(seats); ss != bs || sf == bf {
		t.Error("changing serverConcurrencyLimit must restart the fronts only")
	}
	var rendered cachev1alpha1.CacheProfile
	if err := yaml.UnmarshalStrict([]byte(seats.ConfigMap.Data[ProfileConfigKey]), &rendered); err != nil {
		t.Fatal(err)
	}
	if rendered.Spec.ServerConcurrencyLimit == nil || *rendered.Spec.ServerConcurrencyLimit != 300 {
		t.Errorf("the front's profile has serverConcurrencyLimit %v, want 300", rendered.Spec.ServerConcurrencyLimit)
	}

	// A rotated serving certificate restarts the front but leaves every
	// shard's StatefulSet as it is (shards re-read the certificate files).
	rotated := certs
	rotated.ServingCertPEM, rotated.ServingKeyPEM = testCerts(t, testProfile()).ServingCertPEM, []byte("other key")
	rd, err := BuildDesired(testProfile(), testOpts, rotated, Monitoring{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range base.Shards {
		if !equality.Semantic.DeepEqual(base.Shards[i], rd.Shards[i]) {
			t.Errorf("shard %d changes with the serving certificate", i)
		}
	}
	if base.Front.Spec.Template.Annotations[AnnotationCertHash] == rd.Front.Spec.Template.Annotations[AnnotationCertHash] {
		t.Error("a rotated serving certificate must restart the front")
	}
}

// The reader ClusterRole opens the profile's aggregated paths (verb watch
// below status.serverURL, get/list below the group-version's own path) and
// nothing else, and is aggregated into view, edit and admin.
func TestBuildReaderClusterRole(t *testing.T) {
	p := testProfile()
	cr := BuildReaderClusterRole(p)
	want := []rbacv1.PolicyRule{{APIGroups: []string{"fleet.cache.cachetier.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}}
	if cr.Name != "cachetier:fleet:reader" || !equality.Semantic.DeepEqual(cr.Rules, want) {
		t.Errorf("reader cluster role: %s %+v", cr.Name, cr.Rules)
	}
	for _, role := range []string{"view", "edit", "admin"} {
		if cr.Labels["rbac.authorization.k8s.io/aggregate-to-"+role] != "true" {
			t.Errorf("not aggregated into %s: %v", role, cr.Labels)
		}
	}
	if cr.Labels[LabelProfile] != "fleet" || cr.Labels[LabelManagedBy] != ManagedByValue {
		t.Errorf("cleanup labels missing: %v", cr.Labels)
	}
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(d.Objects(), func(o client.Object) bool {
		return o.GetName() == cr.Name && o.GetObjectKind().GroupVersionKind().Kind == "ClusterRole"
	}) {
		t.Error("the reader cluster role is not applied")
	}
}

func TestServerURLAndNames(t *testing.T) {
	p := testProfile()
	if got := ServerURL("https://api.example.com:6443/", p); got != "https://api.example.com:6443/apis/fleet.cache.cachetier.io/v1alpha1/watch" {
		t.Errorf("ServerURL = %s", got)
	}
	p.Name = strings.Repeat("a", 40)
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{ServiceMonitor: true, PrometheusRule: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range d.Objects() {
		if o.GetObjectKind().GroupVersionKind().Kind == "Service" {
			if errs := validation.IsDNS1035Label(o.GetName()); len(errs) > 0 {
				t.Errorf("service name %s: %v", o.GetName(), errs)
			}
		}
	}
	for _, s := range d.Shards {
		// StatefulSet pods get a controller-revision-hash label made of the
		// name plus 11 characters, which must stay a valid label value.
		if len(s.Name)+11 > 63 {
			t.Errorf("StatefulSet name %s too long", s.Name)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	if msg := ValidateSpec(testProfile()); msg != "" {
		t.Fatalf("valid profile refused: %s", msg)
	}
	for name, mut := range map[string]func(*cachev1alpha1.CacheProfile){
		"more shards than hash shards": func(p *cachev1alpha1.CacheProfile) { p.Spec.Shards = 11 },
		"duplicate resource":           func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources[1].Resource = "pods" },
		"bad selector": func(p *cachev1alpha1.CacheProfile) {
			p.Spec.Resources[0].LabelSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
		},
		"no resources": func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources = nil },
	} {
		p := testProfile()
		mut(p)
		if ValidateSpec(p) == "" {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestFrontsReadShardAddressesFromTheirNamespaceOnly: the fronts are told
// to resolve shard replicas from the shards' headless Service, and the
// fleet's ServiceAccount may read exactly the EndpointSlices of its own
// namespace for that.
func TestFrontsReadShardAddressesFromTheirNamespaceOnly(t *testing.T) {
	p := testProfile()
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{})
	if err != nil {
		t.Fatal(err)
	}
	want := "--shard-addresses-from=cachetier-system/" + d.ShardsService.Name
	if !slices.Contains(d.Front.Spec.Template.Spec.Containers[0].Args, want) {
		t.Errorf("front args %v lack %s", d.Front.Spec.Template.Spec.Containers[0].Args, want)
	}
	r, b := d.ShardsReaderRole, d.ShardsReaderBinding
	wantRules := []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}}
	if r.Namespace != testOpts.Namespace || !equality.Semantic.DeepEqual(r.Rules, wantRules) {
		t.Errorf("role %s/%s: %+v", r.Namespace, r.Name, r.Rules)
	}
	if b.Namespace != testOpts.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != r.Name ||
		len(b.Subjects) != 1 || b.Subjects[0].Name != d.ServiceAccount.Name || b.Subjects[0].Namespace != testOpts.Namespace {
		t.Errorf("binding %+v", b)
	}
	objs := d.Objects()
	if i, j := slices.Index(objs, client.Object(r)), slices.Index(objs, client.Object(d.Front)); i < 0 || j < 0 || i > j {
		t.Errorf("the role is applied at %d, the front at %d: the fronts would start without it", i, j)
	}
}

package integration

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
)

// assertChildren checks every child of the test profile as stored by the
// real apiserver (so defaulting and validation of the built objects are
// exercised too).
func assertChildren(t *testing.T, h *harness, shards [2]appsv1.StatefulSet) {
	t.Helper()
	ctx := context.Background()
	c := h.client
	get := func(ns, name string, o client.Object) {
		t.Helper()
		if err := c.Get(ctx, key(ns, name), o); err != nil {
			t.Fatalf("%T %s/%s: %v", o, ns, name, err)
		}
		if o.GetLabels()[controllers.LabelProfile] != profileName {
			t.Errorf("%T %s lacks the profile label", o, name)
		}
	}

	for i, hashShards := range []string{"0-1", "2-3"} {
		s := shards[i]
		args := s.Spec.Template.Spec.Containers[0].Args
		want := []string{
			"shard",
			"--profile=/etc/cachetier/config/cacheprofile.yaml",
			fmt.Sprintf("--shard-name=fleet-shard-%d", i),
			"--hash-shards=" + hashShards,
			"--listen=0.0.0.0:8444",
			"--metrics-listen=0.0.0.0:9090",
			"--tls-cert-file=/etc/cachetier/tls/tls.crt",
			"--tls-private-key-file=/etc/cachetier/tls/tls.key",
		}
		if !slices.Equal(args, want) || *s.Spec.Replicas != 2 || s.Spec.ServiceName != "fleet-shards" {
			t.Errorf("shard %d: replicas %d service %s args %v", i, *s.Spec.Replicas, s.Spec.ServiceName, args)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "CacheProfile" {
			t.Errorf("shard %d owner: %+v", i, s.OwnerReferences)
		}
		if err := mountsServingSecret(s.Spec.Template.Spec); err != nil {
			t.Errorf("shard %d: %v", i, err)
		}
		// The cache-server re-reads the certificate: no rotation restart.
		if _, ok := s.Spec.Template.Annotations[controllers.AnnotationCertHash]; ok || s.Spec.Template.Annotations[controllers.AnnotationConfigHash] == "" {
			t.Errorf("shard %d pod annotations: %v", i, s.Spec.Template.Annotations)
		}
	}

	var headless, front corev1.Service
	get(workloadNamespace, "fleet-shards", &headless)
	get(workloadNamespace, "fleet-front", &front)
	if headless.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("shards service not headless: %s", headless.Spec.ClusterIP)
	}
	if front.Spec.ClusterIP != frontClusterIP || front.Spec.Ports[0].Port != frontPort || front.Spec.Ports[0].Name != "https" {
		t.Errorf("front service: %+v", front.Spec)
	}

	var dep appsv1.Deployment
	get(workloadNamespace, "fleet-front", &dep)
	if *dep.Spec.Replicas != 2 || dep.Spec.Template.Spec.ServiceAccountName != "fleet-cache-server" ||
		!slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--api-group=fleet.cache.cachetier.io") ||
		!slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--shard-ca-file=/etc/cachetier/tls/ca.crt") {
		t.Errorf("front deployment: %+v", dep.Spec)
	}
	if err := mountsServingSecret(dep.Spec.Template.Spec); err != nil {
		t.Errorf("front: %v", err)
	}

	get(workloadNamespace, "fleet-cache-server", &corev1.ServiceAccount{})

	var cm corev1.ConfigMap
	get(workloadNamespace, "fleet-config", &cm)
	var rendered cachev1alpha1.CacheProfile
	if err := yaml.UnmarshalStrict([]byte(cm.Data[controllers.ProfileConfigKey]), &rendered); err != nil || rendered.Spec.HashShards != 4 ||
		rendered.Spec.Resources[0].FieldIndexes[0] != "spec.nodeName" || rendered.Spec.HistoryWindow == nil {
		t.Errorf("rendered profile: %v %+v", err, rendered.Spec)
	}

	var ca, serving corev1.Secret
	get(workloadNamespace, "fleet-ca", &ca)
	get(workloadNamespace, "fleet-serving-cert", &serving)
	if serving.Type != corev1.SecretTypeTLS || len(serving.Data["tls.crt"]) == 0 || len(ca.Data["ca.key"]) == 0 {
		t.Error("certificate secrets incomplete")
	}
	// The serving certificate verifies, with the mounted ca.crt (the
	// fronts' --shard-ca-file), for every shard endpoint of the topology
	// and for the front Service's name.
	var topo controllers.Topology
	if err := yaml.UnmarshalStrict([]byte(cm.Data[controllers.TopologyKey]), &topo); err != nil {
		t.Fatal(err)
	}
	names := []string{"fleet-front.cachetier-system.svc"}
	for _, s := range topo.Shards {
		for _, ep := range s.Endpoints {
			host, _, err := net.SplitHostPort(ep)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, host)
		}
	}
	if len(names) != 5 {
		t.Errorf("topology endpoints: %v", names)
	}
	if err := verifiesFor(serving.Data, time.Now(), names...); err != nil {
		t.Error(err)
	}

	for _, name := range []string{"fleet-shard-0", "fleet-shard-1", "fleet-front"} {
		var pdb policyv1.PodDisruptionBudget
		get(workloadNamespace, name, &pdb)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PDB %s: %+v", name, pdb.Spec)
		}
	}

	var cr rbacv1.ClusterRole
	get("", "cachetier:fleet:cache-server", &cr)
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps", "namespaces", "pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		// Priority and fairness configuration, read only: the Dangling
		// status writes are deliberately not granted (docs/priority-and-fairness.md).
		{APIGroups: []string{"flowcontrol.apiserver.k8s.io"}, Resources: []string{"flowschemas", "prioritylevelconfigurations"}, Verbs: []string{"list", "watch"}},
		{NonResourceURLs: []string{"/shard/v1/*"}, Verbs: []string{"get"}},
	}
	if got, want := mustYAML(t, cr.Rules), mustYAML(t, wantRules); got != want {
		t.Errorf("cluster role rules:\n%s\nwant\n%s", got, want)
	}
	// The manager (impersonating its ServiceAccount) could create that rule
	// although it does not hold it (escalate), and shards' authorization
	// lets the fleet's ServiceAccount through and nobody else.
	// (Polled: the apiserver's authorizer sees new RBAC objects through
	// its informers.)
	eventually(t, 10*time.Second, "shard API authorization", func() error {
		for _, who := range []struct {
			sa    string
			allow bool
		}{{"fleet-cache-server", true}, {operatorServiceAccount, false}, {"default", false}} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:                  "system:serviceaccount:" + workloadNamespace + ":" + who.sa,
				Groups:                []string{"system:serviceaccounts", "system:serviceaccounts:" + workloadNamespace, "system:authenticated"},
				NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/shard/v1/list", Verb: "get"},
			}}
			if err := c.Create(ctx, sar); err != nil {
				return err
			}
			if sar.Status.Allowed != who.allow {
				return fmt.Errorf("%s get /shard/v1/list: allowed=%v, want %v (%s)", who.sa, sar.Status.Allowed, who.allow, sar.Status.Reason)
			}
		}
		return nil
	})
	var crb rbacv1.ClusterRoleBinding
	get("", "cachetier:fleet:cache-server", &crb)
	if crb.Subjects[0].Name != "fleet-cache-server" || crb.Subjects[0].Namespace != workloadNamespace {
		t.Errorf("cluster role binding: %+v", crb)
	}
	assertReaderRole(t, h, get)
	var rb rbacv1.RoleBinding
	get("kube-system", "cachetier:fleet:auth-reader", &rb)
	if rb.RoleRef.Name != "extension-apiserver-authentication-reader" {
		t.Errorf("auth reader binding: %+v", rb.RoleRef)
	}

	var a apiregv1.APIService
	get("", "v1alpha1.fleet.cache.cachetier.io", &a)
	if a.Spec.Group != "fleet.cache.cachetier.io" || a.Spec.Service.Name != "fleet-front" || *a.Spec.Service.Port != frontPort ||
		string(a.Spec.CABundle) != string(ca.Data["ca.crt"]) {
		t.Errorf("APIService: %+v", a.Spec)
	}

	p := h.profile(t)
	if !slices.Contains(p.Finalizers, controllers.Finalizer) {
		t.Errorf("finalizer missing: %v", p.Finalizers)
	}
	if p.Spec.ReplicasPerShard != 2 || p.Spec.FrontReplicas != 2 || p.Spec.FreshnessTimeout.Duration.String() != "3s" ||
		!*p.Spec.Expose.APIService.Enabled || p.Spec.Expose.APIService.GroupPriorityMinimum != 1000 {
		t.Errorf("schema defaults not applied: %+v", p.Spec)
	}
}

// mountsServingSecret: fronts and shards mount the serving Secret alike.
func mountsServingSecret(spec corev1.PodSpec) error {
	var vol *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == "tls" {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "fleet-serving-cert" {
		return fmt.Errorf("no tls volume of the serving Secret: %+v", spec.Volumes)
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.Name == "tls" && m.MountPath == controllers.TLSMountPath && m.ReadOnly {
			return nil
		}
	}
	return fmt.Errorf("tls volume not mounted read-only at %s: %+v", controllers.TLSMountPath, spec.Containers[0].VolumeMounts)
}

// verifiesFor checks that the serving Secret's tls.crt verifies against its
// own ca.crt for each name at time at.
func verifiesFor(data map[string][]byte, at time.Time, names ...string) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[controllers.TLSCAKey]) {
		return fmt.Errorf("serving Secret: no CA in %s", controllers.TLSCAKey)
	}
	b, _ := pem.Decode(data[corev1.TLSCertKey])
	if b == nil {
		return errors.New("serving Secret: tls.crt is not PEM")
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: n, Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("serving certificate for %s: %w", n, err)
		}
	}
	return nil
}

func mustYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// assertReaderRole: the reader ClusterRole is aggregated into view, edit
// and admin, and a user bound to it passes the apiserver's authorization of
// the aggregated paths as the apiserver classifies them: below
// status.serverURL (…/v1alpha1/watch/api/v1/namespaces/x/pods) verb watch
// on resource api, name v1, subresource namespaces; below the
// group-version's own path, get. It opens nothing else.
func assertReaderRole(t *testing.T, h *harness, get func(ns, name string, o client.Object)) {
	t.Helper()
	ctx := context.Background()
	var cr rbacv1.ClusterRole
	get("", "cachetier:fleet:reader", &cr)
	for _, role := range []string{"view", "edit", "admin"} {
		if cr.Labels["rbac.authorization.k8s.io/aggregate-to-"+role] != "true" {
			t.Errorf("reader role not aggregated into %s: %v", role, cr.Labels)
		}
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-fleet-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "reader"}},
	}
	if err := h.client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.client.Delete(ctx, crb) }()
	group := "fleet.cache.cachetier.io"
	eventually(t, 10*time.Second, "reader authorization", func() error {
		for _, c := range []struct {
			attrs authorizationv1.ResourceAttributes
			allow bool
		}{
			{authorizationv1.ResourceAttributes{Verb: "watch", Group: group, Version: "v1alpha1", Resource: "api", Name: "v1", Subresource: "namespaces"}, true},
			{authorizationv1.ResourceAttributes{Verb: "watch", Group: group, Version: "v1alpha1", Resource: "apis"}, true},
			{authorizationv1.ResourceAttributes{Verb: "get", Group: group, Version: "v1alpha1", Resource: "api", Name: "v1", Subresource: "pods"}, true},
			{authorizationv1.ResourceAttributes{Verb: "list", Version: "v1", Resource: "configmaps"}, false},
			{authorizationv1.ResourceAttributes{Verb: "create", Group: group, Version: "v1alpha1", Resource: "api"}, false},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "reader", Groups: []string{"system:authenticated"}, ResourceAttributes: &c.attrs,
			}}
			if err := h.client.Create(ctx, sar); err != nil {
				return err
			}
			if sar.Status.Allowed != c.allow {
				return fmt.Errorf("reader %+v: allowed=%v, want %v (%s)", c.attrs, sar.Status.Allowed, c.allow, sar.Status.Reason)
			}
		}
		return nil
	})
}

package integration

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

	for i, want := range []string{"--hash-shards=0-1", "--hash-shards=2-3"} {
		s := shards[i]
		args := s.Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, want) || *s.Spec.Replicas != 2 || s.Spec.ServiceName != "fleet-shards" {
			t.Errorf("shard %d: replicas %d service %s args %v", i, *s.Spec.Replicas, s.Spec.ServiceName, args)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "CacheProfile" {
			t.Errorf("shard %d owner: %+v", i, s.OwnerReferences)
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
		!slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--api-group=fleet.cache.cachetier.io") {
		t.Errorf("front deployment: %+v", dep.Spec)
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
	}
	if got, want := mustYAML(t, cr.Rules), mustYAML(t, wantRules); got != want {
		t.Errorf("cluster role rules:\n%s\nwant\n%s", got, want)
	}
	var crb rbacv1.ClusterRoleBinding
	get("", "cachetier:fleet:cache-server", &crb)
	if crb.Subjects[0].Name != "fleet-cache-server" || crb.Subjects[0].Namespace != workloadNamespace {
		t.Errorf("cluster role binding: %+v", crb)
	}
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

func mustYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

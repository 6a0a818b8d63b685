package controllers

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

func TestProfileMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg)
	st := &cachev1alpha1.CacheProfileStatus{
		Shards: []cachev1alpha1.ShardStatus{{Name: "fleet-shard-0", ReadyReplicas: 2}, {Name: "fleet-shard-1"}, {Name: "fleet-shard-2", ReadyReplicas: 1}},
		Conditions: []metav1.Condition{
			{Type: cachev1alpha1.ConditionAvailable, Status: metav1.ConditionFalse},
			{Type: cachev1alpha1.ConditionDegraded, Status: metav1.ConditionTrue},
		},
	}
	m.Observe("fleet", st)
	m.Observe("other", &cachev1alpha1.CacheProfileStatus{Shards: []cachev1alpha1.ShardStatus{{Name: "other-shard-0", ReadyReplicas: 1}}})
	// Scale-down: fleet-shard-2 goes away and must not stay at its last value.
	st.Shards = st.Shards[:2]
	m.Observe("fleet", st)
	m.LostPodDeleted("fleet", ComponentShard)
	want := `
# HELP cachetier_profile_lost_pods_deleted_total Fleet pods the operator deleted (grace period 0) after Kubernetes evicted them from an unreachable node, whose kubelet cannot complete the deletion: a StatefulSet replaces such a pod only once it is gone. By component (shard, front).
# TYPE cachetier_profile_lost_pods_deleted_total counter
cachetier_profile_lost_pods_deleted_total{component="front",profile="fleet"} 0
cachetier_profile_lost_pods_deleted_total{component="front",profile="other"} 0
cachetier_profile_lost_pods_deleted_total{component="shard",profile="fleet"} 1
cachetier_profile_lost_pods_deleted_total{component="shard",profile="other"} 0
# HELP cachetier_profile_condition A CacheProfile's status conditions (Available, Progressing, Degraded): 1 when True, 0 otherwise.
# TYPE cachetier_profile_condition gauge
cachetier_profile_condition{profile="fleet",type="Available"} 0
cachetier_profile_condition{profile="fleet",type="Degraded"} 1
# HELP cachetier_profile_shard_ready_replicas Ready replicas of each shard StatefulSet of a CacheProfile, as the operator last observed them.
# TYPE cachetier_profile_shard_ready_replicas gauge
cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-0"} 2
cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-1"} 0
cachetier_profile_shard_ready_replicas{profile="other",shard="other-shard-0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	m.Forget("fleet")
	if n := testutil.CollectAndCount(reg); n != 3 {
		t.Fatalf("%d series after forgetting fleet, want other's 3", n)
	}
	var none *ProfileMetrics
	none.Observe("fleet", st) // a reconciler without metrics
	none.Forget("fleet")
}

// TestReconcileOfAGoneProfileForgetsItsSeries: a profile deleted without
// this operator's finalizer running (stripped by hand, or finalized by a
// previous leader) must not go on exporting its last shard readiness and
// conditions, which the alerts read.
func TestReconcileOfAGoneProfileForgetsItsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg)
	m.Observe("gone", &cachev1alpha1.CacheProfileStatus{Shards: []cachev1alpha1.ShardStatus{{Name: "gone-shard-0", ReadyReplicas: 0}}})
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	r := &CacheProfileReconciler{Client: fake.NewClientBuilder().WithScheme(scheme).Build(), Scheme: scheme, Metrics: m}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg); n != 0 {
		t.Fatalf("%d series left for a profile that no longer exists", n)
	}
}

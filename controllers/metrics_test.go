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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

func metricsScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

func profileWithStatus(name string, st cachev1alpha1.CacheProfileStatus) *cachev1alpha1.CacheProfile {
	return &cachev1alpha1.CacheProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st}
}

// TestProfileMetrics: readiness and conditions are what the profiles'
// status says at scrape time, on any replica (the reader is its cache),
// and follow scale-downs and deletions without the reconciler's help.
func TestProfileMetrics(t *testing.T) {
	fleet := profileWithStatus("fleet", cachev1alpha1.CacheProfileStatus{
		Shards: []cachev1alpha1.ShardStatus{{Name: "fleet-shard-0", ReadyReplicas: 2}, {Name: "fleet-shard-1"}, {Name: "fleet-shard-2", ReadyReplicas: 1}},
		Conditions: []metav1.Condition{
			{Type: cachev1alpha1.ConditionAvailable, Status: metav1.ConditionFalse},
			{Type: cachev1alpha1.ConditionDegraded, Status: metav1.ConditionTrue},
		},
	})
	other := profileWithStatus("other", cachev1alpha1.CacheProfileStatus{Shards: []cachev1alpha1.ShardStatus{{Name: "other-shard-0", ReadyReplicas: 1}}})
	c := fake.NewClientBuilder().WithScheme(metricsScheme(t)).WithObjects(fleet, other).WithStatusSubresource(fleet, other).Build()
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg, c)
	m.Seen("fleet")
	m.Seen("other")
	m.LostPodDeleted("fleet", ComponentShard)
	ctx := context.Background()
	// Scale-down: fleet-shard-2 goes away and must not stay at its last value.
	fleet.Status.Shards = fleet.Status.Shards[:2]
	if err := c.Status().Update(ctx, fleet); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP cachetier_profile_lost_pods_deleted_total Fleet pods the operator deleted (grace period 0) after Kubernetes evicted them from an unreachable node, whose kubelet cannot complete the deletion: a StatefulSet replaces such a pod only once it is gone. By component (shard, front).
# TYPE cachetier_profile_lost_pods_deleted_total counter
cachetier_profile_lost_pods_deleted_total{component="front",profile="fleet"} 0
cachetier_profile_lost_pods_deleted_total{component="front",profile="other"} 0
cachetier_profile_lost_pods_deleted_total{component="shard",profile="fleet"} 1
cachetier_profile_lost_pods_deleted_total{component="shard",profile="other"} 0
# HELP cachetier_profile_condition A CacheProfile's status conditions (Available, Progressing, Degraded): 1 when True, 0 otherwise; every operator replica exports it.
# TYPE cachetier_profile_condition gauge
cachetier_profile_condition{profile="fleet",type="Available"} 0
cachetier_profile_condition{profile="fleet",type="Degraded"} 1
# HELP cachetier_profile_shard_ready_replicas Ready replicas of each shard StatefulSet of a CacheProfile, from its status (status.shards[].readyReplicas); every operator replica exports it.
# TYPE cachetier_profile_shard_ready_replicas gauge
cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-0"} 2
cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-1"} 0
cachetier_profile_shard_ready_replicas{profile="other",shard="other-shard-0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// A second replica, which never reconciled, reads the same status and
	// exports the same readiness and conditions.
	standby := prometheus.NewRegistry()
	NewProfileMetrics(standby, c)
	if err := testutil.GatherAndCompare(standby, strings.NewReader(want), "cachetier_profile_condition", "cachetier_profile_shard_ready_replicas"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, fleet); err != nil {
		t.Fatal(err)
	}
	m.Forget("fleet")
	if n := testutil.CollectAndCount(reg); n != 3 {
		t.Fatalf("%d series after deleting fleet, want other's 3", n)
	}
	var none *ProfileMetrics
	none.Seen("fleet") // a reconciler without metrics
	none.Forget("fleet")
	none.LostPodDeleted("fleet", ComponentShard)
}

// failingReader is a cache that cannot list.
type failingReader struct{ client.Reader }

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return context.DeadlineExceeded
}

// TestProfileMetricsUnreadable: a cache that cannot answer leaves the
// profile series out of that scrape but fails nothing else on the
// registry (an invalid metric would fail the whole scrape).
func TestProfileMetricsUnreadable(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg, failingReader{})
	m.Seen("fleet")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 2 {
		t.Fatalf("gathered %d series (err %v), want the 2 counters", n, err)
	}
}

// TestReconcileOfAGoneProfileForgetsItsSeries: a profile deleted without
// this operator's finalizer running (stripped by hand, or finalized by a
// previous leader) must not go on exporting its counters.
func TestReconcileOfAGoneProfileForgetsItsSeries(t *testing.T) {
	scheme := metricsScheme(t)
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg, c)
	m.Seen("gone")
	r := &CacheProfileReconciler{Client: c, Scheme: scheme, Metrics: m}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "gone"}}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg); n != 0 {
		t.Fatalf("%d series left for a profile that no longer exists", n)
	}
}

package controllers

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	want := `
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
	if n := testutil.CollectAndCount(reg); n != 1 {
		t.Fatalf("%d series after forgetting fleet, want other's 1", n)
	}
	var none *ProfileMetrics
	none.Observe("fleet", st) // a reconciler without metrics
	none.Forget("fleet")
}

package controllers

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestShardsSettled: surplus shards may go only once every desired shard
// and the front run the desired configuration, fully rolled out — and a
// cached object that still carries the previous configuration (the cache
// lagging the apply that changed it) is not settled however finished its
// rollout looks — and no replaced front pod is still terminating (it
// serves the previous topology until it is gone).
func TestShardsSettled(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	tmpl := func(hash string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationConfigHash: hash}},
			Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](30)},
		}
	}
	sts := func(hash string, ready int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "p-shard-0", Generation: 2},
			Spec:       appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), Template: tmpl(hash)},
			Status: appsv1.StatefulSetStatus{ObservedGeneration: 2, Replicas: 2, ReadyReplicas: ready, UpdatedReplicas: 2,
				CurrentRevision: "r", UpdateRevision: "r"},
		}
	}
	dep := func(hash string, available int32, terminating *int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "p-front", Generation: 3},
			Spec:       appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Template: tmpl(hash)},
			Status: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: available,
				TerminatingReplicas: terminating},
		}
	}
	// completedAt: a control plane without terminatingReplicas, whose
	// rollout completed at t.
	completedAt := func(t time.Time) *appsv1.Deployment {
		d := dep("front-new", 2, nil)
		d.Status.Conditions = []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.NewTime(now)},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: deploymentCompleteReason, LastUpdateTime: metav1.NewTime(t)},
		}
		return d
	}
	shards := func(hash string, ready int32) map[string]*appsv1.StatefulSet {
		return map[string]*appsv1.StatefulSet{"p-shard-0": sts(hash, ready)}
	}
	desired := &Desired{Shards: []*appsv1.StatefulSet{sts("shard-new", 2)}, Front: dep("front-new", 2, nil)}
	for _, c := range []struct {
		name     string
		obs      Observed
		want     bool
		wantWait time.Duration
	}{
		{"all current and ready", Observed{Shards: shards("shard-new", 2), Front: dep("front-new", 2, ptr.To[int32](0))}, true, 0},
		{"front still on the previous topology in the cache", Observed{Shards: shards("shard-new", 2), Front: dep("front-old", 2, ptr.To[int32](0))}, false, 0},
		{"shard still on the previous configuration", Observed{Shards: shards("shard-old", 2), Front: dep("front-new", 2, ptr.To[int32](0))}, false, 0},
		{"shard replica not ready", Observed{Shards: shards("shard-new", 1), Front: dep("front-new", 2, ptr.To[int32](0))}, false, 0},
		{"front replica not available", Observed{Shards: shards("shard-new", 2), Front: dep("front-new", 1, ptr.To[int32](0))}, false, 0},
		{"shard missing", Observed{Shards: map[string]*appsv1.StatefulSet{}, Front: dep("front-new", 2, ptr.To[int32](0))}, false, 0},
		{"front missing", Observed{Shards: shards("shard-new", 2)}, false, 0},
		{"rolled out, a replaced front pod still terminating", Observed{Shards: shards("shard-new", 2), Front: dep("front-new", 2, ptr.To[int32](1))}, false, 0},
		// Control planes before 1.35 (or with the gate off) do not report
		// terminating pods: wait the grace period from the rollout's end.
		{"no terminating count, rollout completed 10s ago", Observed{Shards: shards("shard-new", 2), Front: completedAt(now.Add(-10 * time.Second))}, false, 20 * time.Second},
		{"no terminating count, rollout completed a grace period ago", Observed{Shards: shards("shard-new", 2), Front: completedAt(now.Add(-30 * time.Second))}, true, 0},
		{"no terminating count, no Progressing condition", Observed{Shards: shards("shard-new", 2), Front: dep("front-new", 2, nil)}, true, 0},
	} {
		got, wait := shardsSettled(desired, c.obs, now)
		if got != c.want || wait != c.wantWait {
			t.Errorf("%s: settled %v after %v, want %v after %v", c.name, got, wait, c.want, c.wantWait)
		}
	}
}

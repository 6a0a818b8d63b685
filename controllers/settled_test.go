package controllers

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestShardsSettled: surplus shards may go only once every desired shard
// and the front run the desired configuration, fully rolled out — and a
// cached object that still carries the previous configuration (the cache
// lagging the apply that changed it) is not settled however finished its
// rollout looks.
func TestShardsSettled(t *testing.T) {
	tmpl := func(hash string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationConfigHash: hash}}}
	}
	sts := func(hash string, ready int32) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Name: "p-shard-0", Generation: 2},
			Spec:       appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), Template: tmpl(hash)},
			Status: appsv1.StatefulSetStatus{ObservedGeneration: 2, Replicas: 2, ReadyReplicas: ready, UpdatedReplicas: 2,
				CurrentRevision: "r", UpdateRevision: "r"},
		}
	}
	dep := func(hash string, available int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "p-front", Generation: 3},
			Spec:       appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Template: tmpl(hash)},
			Status:     appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: available},
		}
	}
	desired := &Desired{Shards: []*appsv1.StatefulSet{sts("shard-new", 2)}, Front: dep("front-new", 2)}
	for _, c := range []struct {
		name string
		obs  Observed
		want bool
	}{
		{"all current and ready", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-new", 2)}, Front: dep("front-new", 2)}, true},
		{"front still on the previous topology in the cache", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-new", 2)}, Front: dep("front-old", 2)}, false},
		{"shard still on the previous configuration", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-old", 2)}, Front: dep("front-new", 2)}, false},
		{"shard replica not ready", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-new", 1)}, Front: dep("front-new", 2)}, false},
		{"front replica not available", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-new", 2)}, Front: dep("front-new", 1)}, false},
		{"shard missing", Observed{Shards: map[string]*appsv1.StatefulSet{}, Front: dep("front-new", 2)}, false},
		{"front missing", Observed{Shards: map[string]*appsv1.StatefulSet{"p-shard-0": sts("shard-new", 2)}}, false},
	} {
		if got := shardsSettled(desired, c.obs); got != c.want {
			t.Errorf("%s: settled %v, want %v", c.name, got, c.want)
		}
	}
}

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// testLostNode: a node the node lifecycle controller found unreachable
// (Ready Unknown, tainted node.kubernetes.io/unreachable) with a shard pod
// and a front pod bound to it. The apiserver keeps a pod whose node has no
// kubelet Terminating for ever; the operator, with the RBAC config/default
// gives it, deletes the shard pod Kubernetes evicted, counts it, says so in
// an event, and names the node and what ran there in Degraded until no
// fleet pod is left on it. The pod not evicted (still tolerating the
// taint) is left alone.
func testLostNode(t *testing.T, h *harness) {
	ctx := context.Background()
	c := h.client
	const nodeName = "lost-node"
	since := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule, TimeAdded: &since},
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &since},
		}},
	}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status.", LastHeartbeatTime: since, LastTransitionTime: since}}
	if err := c.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}

	// A pod of each, as their controllers made them: the templates the
	// operator rendered, owned by the StatefulSet and the Deployment,
	// bound to the node.
	var sts appsv1.StatefulSet
	if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &sts); err != nil {
		t.Fatal(err)
	}
	var front appsv1.Deployment
	if err := c.Get(ctx, key(workloadNamespace, "fleet-front"), &front); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, tmpl corev1.PodTemplateSpec, owner client.Object, kind string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloadNamespace, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: owner.GetName(), UID: owner.GetUID(), Controller: ptr.To(true)}}},
			Spec: *tmpl.Spec.DeepCopy()}
		p.Spec.NodeName = nodeName
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shardPod := pod("fleet-shard-0-1", sts.Spec.Template, &sts, "StatefulSet")
	frontPod := pod("fleet-front-lost", front.Spec.Template, &front, "Deployment")
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), frontPod, client.GracePeriodSeconds(0))
		_ = c.Delete(context.Background(), shardPod, client.GracePeriodSeconds(0))
	})

	eventually(t, 20*time.Second, "degraded naming the node", func() error {
		if err := h.conditionsAre(map[string]string{"Degraded": "True/NodeUnavailable"}); err != nil {
			return err
		}
		d := meta.FindStatusCondition(h.profile(t).Status.Conditions, "Degraded")
		for _, want := range []string{nodeName, "unreachable since " + since.UTC().Format(time.RFC3339), "fleet-shard-0", "fleet-front", "fleet-shard-0-1"} {
			if !strings.Contains(d.Message, want) {
				return fmt.Errorf("Degraded message %q does not say %q", d.Message, want)
			}
		}
		return nil
	})
	// Not evicted yet (its toleration has not run out): left alone.
	time.Sleep(2 * time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(shardPod), &corev1.Pod{}); err != nil {
		t.Fatalf("the operator touched a pod Kubernetes had not evicted: %v", err)
	}

	// Kubernetes evicts it: a graceful delete that no kubelet completes.
	if err := c.Delete(ctx, shardPod, client.GracePeriodSeconds(30)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the evicted shard pod deleted", func() error {
		err := c.Get(ctx, client.ObjectKeyFromObject(shardPod), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	eventually(t, 10*time.Second, "event about the pod", func() error {
		var evs eventsv1.EventList
		if err := c.List(ctx, &evs); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "LostPodDeleted" && e.Regarding.Name == profileName && e.Related != nil && e.Related.Name == shardPod.Name &&
				strings.Contains(e.Note, nodeName) {
				return nil
			}
		}
		return fmt.Errorf("no LostPodDeleted event about %s among %d", shardPod.Name, len(evs.Items))
	})
	h.metricsAre(t, map[string]float64{
		`cachetier_profile_lost_pods_deleted_total{component="shard",profile="fleet"}`: 1,
		`cachetier_profile_lost_pods_deleted_total{component="front",profile="fleet"}`: 0,
	})
	var still corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(frontPod), &still); err != nil || still.DeletionTimestamp != nil {
		t.Fatalf("the front pod, not evicted, was deleted: %v", err)
	}
	eventually(t, 20*time.Second, "degraded names only the front now", func() error {
		d := meta.FindStatusCondition(h.profile(t).Status.Conditions, "Degraded")
		if d == nil || strings.Contains(d.Message, "fleet-shard-0-1") || !strings.Contains(d.Message, "fleet-front-lost") {
			return fmt.Errorf("Degraded: %+v", d)
		}
		return nil
	})

	// The node is gone for good and so is the last pod: not degraded.
	if err := c.Delete(ctx, frontPod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "recovered", func() error {
		return h.conditionsAre(map[string]string{"Available": "True/Available", "Degraded": "False/AsExpected"})
	})
}

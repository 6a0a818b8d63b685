package controllers

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

var lostAt = metav1.NewTime(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))

func testNode(name string, ready corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "R", Message: "m",
			LastTransitionTime: lostAt}}},
	}
}

func unreachableTaints() []corev1.Taint {
	return []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule, TimeAdded: &lostAt},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &lostAt},
	}
}

func fleetPod(name, node, component, owner string, terminating bool) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelInstance: "fleet", LabelComponent: component}},
		Spec:       corev1.PodSpec{NodeName: node},
	}
	if owner != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "StatefulSet", Name: owner, Controller: ptr.To(true)}}
	}
	if terminating {
		p.DeletionTimestamp = &lostAt
	}
	return p
}

// TestFindNodeLoss: only pods Kubernetes evicted (terminating) from a node
// tainted unreachable are deleted; every node that is not Ready with fleet
// pods on it is named with what ran there; pods on Ready nodes, unbound
// pods, and a NotReady node whose kubelet still answers (it stops its pods
// itself) are left alone.
func TestFindNodeLoss(t *testing.T) {
	nodes := map[string]*corev1.Node{
		"ok":       testNode("ok", corev1.ConditionTrue),
		"lost":     testNode("lost", corev1.ConditionUnknown, unreachableTaints()...),
		"notready": testNode("notready", corev1.ConditionFalse, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}),
	}
	pods := []corev1.Pod{
		fleetPod("fleet-shard-0-0", "ok", ComponentShard, "fleet-shard-0", true),
		fleetPod("fleet-shard-0-1", "lost", ComponentShard, "fleet-shard-0", true),
		fleetPod("fleet-shard-1-0", "lost", ComponentShard, "fleet-shard-1", false),
		fleetPod("fleet-front-a", "lost", ComponentFront, "", true),
		fleetPod("fleet-shard-1-1", "notready", ComponentShard, "fleet-shard-1", true),
		fleetPod("fleet-front-b", "gone", ComponentFront, "", false),
		fleetPod("fleet-shard-2-0", "", ComponentShard, "fleet-shard-2", false),
	}
	loss := FindNodeLoss(pods, nodes)
	var deleted []string
	for _, d := range loss.Delete {
		deleted = append(deleted, d.Pod.Name+"/"+d.Component+"/"+d.Part)
		if !d.Since.Equal(lostAt.Time) {
			t.Errorf("%s: since %v, want the taint's %v", d.Pod.Name, d.Since, lostAt)
		}
	}
	if want := []string{"fleet-shard-0-1/shard/fleet-shard-0", "fleet-front-a/front/fleet-front"}; !slices.Equal(deleted, want) {
		t.Errorf("deleted %v, want %v", deleted, want)
	}
	var got []string
	for _, pr := range loss.Problems {
		got = append(got, pr.Node+": "+pr.State+": "+strings.Join(pr.Parts, ",")+": "+strings.Join(pr.Pods, ","))
	}
	want := []string{
		"gone: deleted: fleet-front: fleet-front-b",
		"lost: unreachable since 2026-11-26T10:00:00Z: fleet-front,fleet-shard-0,fleet-shard-1: fleet-front-a,fleet-shard-0-1,fleet-shard-1-0",
		"notready: Ready=False since 2026-11-26T10:00:00Z (R: m): fleet-shard-1: fleet-shard-1-1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if loss := FindNodeLoss(pods[:1], nodes); len(loss.Problems)+len(loss.Delete) != 0 {
		t.Errorf("a Ready node is a problem: %+v", loss)
	}
}

// TestStatusNamesTheLostNode: Degraded says which node is lost and which
// shards and front ran there, ahead of the unready replicas it caused;
// Available stays True while every shard has a ready replica.
func TestStatusNamesTheLostNode(t *testing.T) {
	p := testProfile()
	obs := healthy()
	obs.Shards["fleet-shard-0"] = readySTS("fleet-shard-0", 2, 1)
	obs.NodeProblems = FindNodeLoss([]corev1.Pod{fleetPod("fleet-shard-0-1", "node-2", ComponentShard, "fleet-shard-0", false)},
		map[string]*corev1.Node{"node-2": testNode("node-2", corev1.ConditionUnknown, unreachableTaints()...)}).Problems
	st := ComputeStatus(p, testOpts, obs, time.Now())
	d := cond(st, cachev1alpha1.ConditionDegraded)
	if d.Status != metav1.ConditionTrue || d.Reason != ReasonNodeUnavailable {
		t.Fatalf("Degraded %s/%s: %s", d.Status, d.Reason, d.Message)
	}
	for _, want := range []string{"node node-2 is unreachable since 2026-11-26T10:00:00Z", "fleet-shard-0 ran there (pods fleet-shard-0-1)", "fleet-shard-0 (1/2 ready)"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("Degraded message lacks %q: %s", want, d.Message)
		}
	}
	if strings.Index(d.Message, "node-2") > strings.Index(d.Message, "(1/2 ready)") {
		t.Errorf("the lost node is not named first: %s", d.Message)
	}
	if a := cond(st, cachev1alpha1.ConditionAvailable); a.Status != metav1.ConditionTrue {
		t.Errorf("Available %s/%s with a ready replica of every shard", a.Status, a.Reason)
	}
}

// TestNodeHealthChangedIgnoresHeartbeats: the node watch reacts to a node
// turning NotReady or tainted, not to the status updates a healthy kubelet
// posts; the pod watch to a pod placed or evicted, not to its status.
func TestNodeHealthChangedIgnoresHeartbeats(t *testing.T) {
	old := testNode("n", corev1.ConditionTrue)
	heartbeat := old.DeepCopy()
	heartbeat.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	heartbeat.ResourceVersion = "2"
	notReady := testNode("n", corev1.ConditionUnknown)
	tainted := testNode("n", corev1.ConditionTrue, unreachableTaints()...)
	for _, tc := range []struct {
		name string
		new  *corev1.Node
		want bool
	}{{"heartbeat", heartbeat, false}, {"not ready", notReady, true}, {"tainted", tainted, true}} {
		if got := nodeHealthChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !nodeHealthChanged.Create(event.CreateEvent{Object: old}) || !nodeHealthChanged.Delete(event.DeleteEvent{Object: old}) {
		t.Error("a node appearing or going is a change")
	}
	pod := fleetPod("p", "", ComponentShard, "s", false)
	status := pod.DeepCopy()
	status.Status.Phase = corev1.PodRunning
	bound := pod.DeepCopy()
	bound.Spec.NodeName = "n"
	evicted := bound.DeepCopy()
	evicted.DeletionTimestamp = &lostAt
	for _, tc := range []struct {
		name     string
		old, new *corev1.Pod
		want     bool
	}{{"status", &pod, status, false}, {"bound", &pod, bound, true}, {"evicted", bound, evicted, true}, {"still evicted", evicted, evicted, false}} {
		if got := podPlacedOrTerminating.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
			t.Errorf("pod update %s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !podPlacedOrTerminating.Create(event.CreateEvent{Object: &pod}) || !podPlacedOrTerminating.Delete(event.DeleteEvent{Object: &pod}) {
		t.Error("a pod appearing or going is news")
	}
}

package controllers

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// What the operator does about a node that stopped answering.
//
// The node lifecycle controller marks such a node's Ready condition
// Unknown and taints it node.kubernetes.io/unreachable once its kubelet
// has not renewed its lease for node-monitor-grace-period (50 s by
// default); the fleet's pods tolerate that taint for
// NodeLossTolerationSeconds, after which Kubernetes evicts them: it sets
// their deletionTimestamp. Only the kubelet of the node can complete the
// deletion, and it is gone. A Deployment (the front) replaces a
// terminating pod at once; a StatefulSet (a shard) does not replace a pod
// until its object is gone — the guarantee a stateful workload needs,
// which a stateless cache does not: a shard replica that still ran on a
// node cut off from the cluster could not be reached and would hold
// nothing anyone else needs. So the operator finishes the eviction: it
// deletes, with grace period 0, every fleet pod that Kubernetes already
// evicted from an unreachable node — the StatefulSet then creates the
// replica again on a node that works. The fronts' pods get the same
// treatment, so that no terminating front is left counting as a replaced
// pod not yet drained (which would hold a shard scale-down back).
//
// A node taken out of service by a person (the node.kubernetes.io/
// out-of-service taint) needs nothing from the operator: Kubernetes
// evicts its pods at once and its pod garbage collector deletes them.

// NodeLoss is what one reconcile saw of the nodes the fleet runs on.
type NodeLoss struct {
	// Problems are the nodes with fleet pods that are not Ready, by name.
	Problems []NodeProblem
	// Delete are the pods to delete now (see above).
	Delete []LostPod
}

// NodeProblem is a node that is not Ready with fleet pods bound to it.
type NodeProblem struct {
	Node string
	// State says what is wrong and since when.
	State string
	// Parts are the shards (StatefulSet names) and the front (its
	// Deployment's name) whose pods are bound to it.
	Parts []string
	// Pods are those pods' names.
	Pods []string
}

// LostPod is a fleet pod Kubernetes evicted from an unreachable node.
type LostPod struct {
	Pod *corev1.Pod
	// Component is the pod's (shard or front), Part its shard or front.
	Component, Part string
	// Since is when the node was tainted unreachable.
	Since time.Time
}

// FindNodeLoss looks at the fleet's pods and the nodes they are bound to
// (nodes by name; a missing node is one that was deleted). Pure.
func FindNodeLoss(pods []corev1.Pod, nodes map[string]*corev1.Node) NodeLoss {
	var out NodeLoss
	byNode := map[string]*NodeProblem{}
	for i := range pods {
		pod := &pods[i]
		name := pod.Spec.NodeName
		if name == "" {
			continue
		}
		node := nodes[name]
		state, unreachable := nodeState(node)
		if state == "" {
			continue
		}
		part := podPart(pod)
		if pod.DeletionTimestamp != nil && unreachable != nil {
			out.Delete = append(out.Delete, LostPod{Pod: pod, Component: pod.Labels[LabelComponent], Part: part, Since: unreachable.TimeAdded.Time})
		}
		pr := byNode[name]
		if pr == nil {
			pr = &NodeProblem{Node: name, State: state}
			byNode[name] = pr
		}
		pr.Pods = append(pr.Pods, pod.Name)
		if !contains(pr.Parts, part) {
			pr.Parts = append(pr.Parts, part)
		}
	}
	for _, pr := range byNode {
		sort.Strings(pr.Parts)
		sort.Strings(pr.Pods)
		out.Problems = append(out.Problems, *pr)
	}
	sort.Slice(out.Problems, func(i, j int) bool { return out.Problems[i].Node < out.Problems[j].Node })
	return out
}

// nodeState describes a node that is not Ready ("" for a Ready one) and
// returns its unreachable taint, if any. The taint — not the Ready
// condition — is what says the kubelet is out of touch: a kubelet that
// reports NotReady still stops its pods itself.
func nodeState(n *corev1.Node) (string, *corev1.Taint) {
	if n == nil {
		return "deleted", nil
	}
	var unreachable *corev1.Taint
	for i := range n.Spec.Taints {
		if t := &n.Spec.Taints[i]; t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoExecute {
			unreachable = t
		}
	}
	var ready *corev1.NodeCondition
	for i := range n.Status.Conditions {
		if c := &n.Status.Conditions[i]; c.Type == corev1.NodeReady {
			ready = c
		}
	}
	switch {
	case unreachable != nil && unreachable.TimeAdded != nil:
		return fmt.Sprintf("unreachable since %s", unreachable.TimeAdded.UTC().Format(time.RFC3339)), unreachable
	case unreachable != nil:
		return "unreachable", unreachable
	case ready == nil:
		return "", nil // not reported yet: a node still registering
	case ready.Status != corev1.ConditionTrue:
		return fmt.Sprintf("Ready=%s since %s (%s: %s)", ready.Status, ready.LastTransitionTime.UTC().Format(time.RFC3339), ready.Reason, ready.Message), nil
	}
	return "", nil
}

// podPart is the shard (StatefulSet) or front (Deployment) a fleet pod
// belongs to, named as the status names them.
func podPart(pod *corev1.Pod) string {
	if pod.Labels[LabelComponent] == ComponentFront {
		return pod.Labels[LabelInstance] + "-front"
	}
	for _, o := range pod.OwnerReferences {
		if o.Kind == "StatefulSet" {
			return o.Name
		}
	}
	return pod.Name
}

// nodeProblemMessage is the Degraded condition's sentence about the lost
// nodes.
func nodeProblemMessage(problems []NodeProblem) string {
	var parts []string
	for _, pr := range problems {
		parts = append(parts, fmt.Sprintf("node %s is %s; %s ran there (pods %s)",
			pr.Node, pr.State, strings.Join(pr.Parts, ", "), strings.Join(pr.Pods, ", ")))
	}
	return strings.Join(parts, "; ") + fmt.Sprintf(" — Kubernetes evicts them %d s after the node is marked unreachable, and the operator deletes what the node's kubelet cannot, so that they are replaced on other nodes", NodeLossTolerationSeconds)
}

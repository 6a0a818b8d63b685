package controllers

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// Where a fleet's pods run, and what happens to them when a node goes away.
//
// Spread: the replicas of one shard, and the fronts, are spread over nodes
// with a topology spread constraint on kubernetes.io/hostname, maxSkew 1,
// whenUnsatisfiable DoNotSchedule — required, because here it cannot
// hurt:
//   - with as many schedulable nodes as replicas, no two replicas of a
//     shard (or two fronts) share a node, so losing a node never takes a
//     shard's last replica;
//   - with fewer (one node, a laptop), it still schedules every replica:
//     the skew between the one domain and itself is never above 1, and
//     with several nodes it spreads the replicas evenly;
//   - nodeTaintsPolicy Honor leaves out nodes whose taints the pod does not
//     tolerate: a cordoned node being drained (node.kubernetes.io/
//     unschedulable) and a dead one (node.kubernetes.io/unreachable,
//     NoSchedule) are not domains, so their pods (which do not count once
//     terminating anyway) cannot pin the skew and hold a replacement
//     Pending;
//   - nodeAffinityPolicy Honor: only nodes the profile's nodeSelector and
//     node affinity allow are domains.
//
// Required anti-affinity would refuse a second replica on a one-node
// cluster; preferred anti-affinity (what the operator rendered before)
// gives no guarantee at all. A profile whose own constraints already
// spread over kubernetes.io/hostname keeps them instead.
//
// Node loss: the pods tolerate node.kubernetes.io/unreachable and
// not-ready (NoExecute) for NodeLossTolerationSeconds instead of the
// default 300 s, so Kubernetes evicts them from a lost node soon; the
// front's Deployment replaces an evicted pod at once, and for the
// StatefulSets' pods, which are only replaced once gone, the operator
// finishes the eviction (nodeloss.go). A profile that tolerates either
// taint itself keeps its own tolerations.

// NodeLossTolerationSeconds is how long a fleet pod stays bound to a node
// that stopped answering (or turned NotReady) once the node lifecycle
// controller noticed (node-monitor-grace-period, 50 s by default): the
// cache is stateless and a replacement on another node loads its slice in
// seconds, so waiting five minutes for the node buys nothing.
const NodeLossTolerationSeconds = 30

// nodeLossTaints are the taints the node lifecycle controller puts on a
// node it lost touch with (unreachable: its kubelet stopped renewing its
// lease) or whose kubelet reports it NotReady.
var nodeLossTaints = []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady}

// placement returns the scheduling of a fleet pod whose replica set (one
// shard's pods, or the fronts) podLabels select: the profile's, plus the
// spread and tolerations above.
func placement(sched cachev1alpha1.Scheduling, podLabels map[string]string) (tolerations []corev1.Toleration, spread []corev1.TopologySpreadConstraint) {
	tolerations = append(tolerations, sched.Tolerations...)
	for _, key := range nodeLossTaints {
		if !toleratesNoExecute(sched.Tolerations, key) {
			tolerations = append(tolerations, corev1.Toleration{
				Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute,
				TolerationSeconds: ptr.To[int64](NodeLossTolerationSeconds),
			})
		}
	}
	spread = append(spread, sched.TopologySpreadConstraints...)
	for _, c := range sched.TopologySpreadConstraints {
		if c.TopologyKey == corev1.LabelHostname {
			return tolerations, spread
		}
	}
	spread = append(spread, corev1.TopologySpreadConstraint{
		MaxSkew:            1,
		TopologyKey:        corev1.LabelHostname,
		WhenUnsatisfiable:  corev1.DoNotSchedule,
		LabelSelector:      &metav1.LabelSelector{MatchLabels: podLabels},
		NodeAffinityPolicy: ptr.To(corev1.NodeInclusionPolicyHonor),
		NodeTaintsPolicy:   ptr.To(corev1.NodeInclusionPolicyHonor),
	})
	return tolerations, spread
}

// toleratesNoExecute: one of ts tolerates the NoExecute taint key (any
// value), as the DefaultTolerationSeconds admission plugin decides whether
// to add its own.
func toleratesNoExecute(ts []corev1.Toleration, key string) bool {
	for _, t := range ts {
		if (t.Key == key || t.Key == "") &&
			(t.Effect == "" || t.Effect == corev1.TaintEffectNoExecute) {
			return true
		}
	}
	return false
}

package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// ProfileMetrics exports what the reconciler observes of each profile, so
// that alerts and dashboards see a shard whose pods are all gone (which
// exports no metrics of its own) and every profile's conditions. Labels are
// bounded by the number of profiles and their shards (at most 64 each).
type ProfileMetrics struct {
	shardReady      *prometheus.GaugeVec   // profile, shard
	condition       *prometheus.GaugeVec   // profile, type
	lostPodsDeleted *prometheus.CounterVec // profile, component
}

// NewProfileMetrics creates the metrics and registers them on reg (the
// manager passes controller-runtime's registry, which it serves).
func NewProfileMetrics(reg prometheus.Registerer) *ProfileMetrics {
	m := &ProfileMetrics{
		shardReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_profile_shard_ready_replicas",
			Help: "Ready replicas of each shard StatefulSet of a CacheProfile, as the operator last observed them.",
		}, []string{"profile", "shard"}),
		condition: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_profile_condition",
			Help: "A CacheProfile's status conditions (Available, Progressing, Degraded): 1 when True, 0 otherwise.",
		}, []string{"profile", "type"}),
		lostPodsDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_profile_lost_pods_deleted_total",
			Help: "Fleet pods the operator deleted (grace period 0) after Kubernetes evicted them from an unreachable node, whose kubelet cannot complete the deletion: a StatefulSet replaces such a pod only once it is gone. By component (shard, front).",
		}, []string{"profile", "component"}),
	}
	reg.MustRegister(m.shardReady, m.condition, m.lostPodsDeleted)
	return m
}

// LostPodDeleted counts a pod deleted off an unreachable node (see
// nodeloss.go). A nil ProfileMetrics records nothing.
func (m *ProfileMetrics) LostPodDeleted(profile, component string) {
	if m == nil {
		return
	}
	m.lostPodsDeleted.WithLabelValues(profile, component).Inc()
}

// Observe replaces a profile's series with what its status says. A nil
// ProfileMetrics records nothing.
func (m *ProfileMetrics) Observe(profile string, st *cachev1alpha1.CacheProfileStatus) {
	if m == nil {
		return
	}
	// Shards removed by a scale-down must not linger at their last value.
	m.shardReady.DeletePartialMatch(prometheus.Labels{"profile": profile})
	for _, s := range st.Shards {
		m.shardReady.WithLabelValues(profile, s.Name).Set(float64(s.ReadyReplicas))
	}
	// The counters exist from the start, at 0, so that rates and alerts
	// over them see a series before the first lost node.
	for _, c := range []string{ComponentShard, ComponentFront} {
		m.lostPodsDeleted.WithLabelValues(profile, c)
	}
	for _, t := range []string{cachev1alpha1.ConditionAvailable, cachev1alpha1.ConditionProgressing, cachev1alpha1.ConditionDegraded} {
		v := 0.0
		if meta.IsStatusConditionTrue(st.Conditions, t) {
			v = 1
		}
		if meta.FindStatusCondition(st.Conditions, t) == nil {
			m.condition.DeleteLabelValues(profile, t)
			continue
		}
		m.condition.WithLabelValues(profile, t).Set(v)
	}
}

// Forget drops a deleted profile's series.
func (m *ProfileMetrics) Forget(profile string) {
	if m == nil {
		return
	}
	m.shardReady.DeletePartialMatch(prometheus.Labels{"profile": profile})
	m.condition.DeletePartialMatch(prometheus.Labels{"profile": profile})
	m.lostPodsDeleted.DeletePartialMatch(prometheus.Labels{"profile": profile})
}

// BoundedMetricLabels are the label names the manager exports, each with a
// bounded set of values: profiles and their shards (the profiles that
// exist, at most 64 shards each), condition types, fleet components (shard,
// front), and controller-runtime's
// controller, workqueue name and priority, reconcile result, REST client
// code/method/host, and go_info's version. The metric lint tests hold the
// manager to it.
func BoundedMetricLabels() []string {
	return []string{"profile", "shard", "type", "component", "controller", "name", "priority", "result", "code", "method", "host", "version"}
}

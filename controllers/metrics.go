package controllers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// ProfileMetrics exports each profile's shard readiness and conditions, so
// that alerts and dashboards see a shard whose pods are all gone (which
// exports no metrics of its own), and counts what the reconciler does.
// Labels are bounded by the number of profiles and their shards (at most 64
// each).
//
// Readiness and conditions are read from the profiles' status at scrape
// time, as kube-state-metrics reads objects, and every replica exports them
// from its own cache, not only the leader: a leader change (a lost lease, a
// drain) then changes nothing in the series that alerts aggregate over
// replicas, so a `for:` in progress is not restarted by a new `pod` label
// or a scrape gap while the other replica takes the lease.
type ProfileMetrics struct {
	lostPodsDeleted *prometheus.CounterVec // profile, component
}

// profileStatusCollector is the scrape-time half of ProfileMetrics.
type profileStatusCollector struct {
	profiles              client.Reader
	shardReady, condition *prometheus.Desc
}

// collectTimeout bounds a scrape's read of the profiles: the first one on
// a replica that is not leading starts the cache's CacheProfile informer
// and waits for its initial list.
const collectTimeout = 10 * time.Second

// NewProfileMetrics creates the metrics and registers them on reg (the
// manager passes controller-runtime's registry, which it serves); profiles
// is what the readiness and conditions are read from (the manager's cache).
func NewProfileMetrics(reg prometheus.Registerer, profiles client.Reader) *ProfileMetrics {
	m := &ProfileMetrics{
		lostPodsDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_profile_lost_pods_deleted_total",
			Help: "Fleet pods the operator deleted (grace period 0) after Kubernetes evicted them from an unreachable node, whose kubelet cannot complete the deletion: a StatefulSet replaces such a pod only once it is gone. By component (shard, front).",
		}, []string{"profile", "component"}),
	}
	c := &profileStatusCollector{
		profiles: profiles,
		shardReady: prometheus.NewDesc("cachetier_profile_shard_ready_replicas",
			"Ready replicas of each shard StatefulSet of a CacheProfile, from its status (status.shards[].readyReplicas); every operator replica exports it.",
			[]string{"profile", "shard"}, nil),
		condition: prometheus.NewDesc("cachetier_profile_condition",
			"A CacheProfile's status conditions (Available, Progressing, Degraded): 1 when True, 0 otherwise; every operator replica exports it.",
			[]string{"profile", "type"}, nil),
	}
	reg.MustRegister(m.lostPodsDeleted, c)
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

// Seen makes a profile's counters exist from the start, at 0, so that
// rates and alerts over them see a series before the first lost node. A
// nil ProfileMetrics records nothing.
func (m *ProfileMetrics) Seen(profile string) {
	if m == nil {
		return
	}
	for _, c := range []string{ComponentShard, ComponentFront} {
		m.lostPodsDeleted.WithLabelValues(profile, c)
	}
}

// Forget drops a deleted profile's counters (its readiness and conditions
// go with the object).
func (m *ProfileMetrics) Forget(profile string) {
	if m == nil {
		return
	}
	m.lostPodsDeleted.DeletePartialMatch(prometheus.Labels{"profile": profile})
}

func (c *profileStatusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.shardReady
	ch <- c.condition
}

func (c *profileStatusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	var list cachev1alpha1.CacheProfileList
	if err := c.profiles.List(ctx, &list); err != nil {
		// Not an invalid metric: that would fail the whole scrape, and
		// the controller-runtime series with it.
		log.FromContext(ctx).WithName("metrics").Error(err, "cannot read CacheProfiles for cachetier_profile_* metrics")
		return
	}
	for _, p := range list.Items {
		for _, s := range p.Status.Shards {
			ch <- prometheus.MustNewConstMetric(c.shardReady, prometheus.GaugeValue, float64(s.ReadyReplicas), p.Name, s.Name)
		}
		for _, t := range []string{cachev1alpha1.ConditionAvailable, cachev1alpha1.ConditionProgressing, cachev1alpha1.ConditionDegraded} {
			if meta.FindStatusCondition(p.Status.Conditions, t) == nil {
				continue
			}
			v := 0.0
			if meta.IsStatusConditionTrue(p.Status.Conditions, t) {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.condition, prometheus.GaugeValue, v, p.Name, t)
		}
	}
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

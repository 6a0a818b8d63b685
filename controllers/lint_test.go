package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/internal/metriclint"
)

// TestMetricNamesFollowConventions lints the operator's own metrics and
// what controller-runtime registers on the registry the manager serves
// (controllers/integration lints it again once a controller has run, when
// controller-runtime's per-controller series exist).
func TestMetricNamesFollowConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := profileWithStatus("fleet", cachev1alpha1.CacheProfileStatus{
		Shards:     []cachev1alpha1.ShardStatus{{Name: "fleet-shard-0", ReadyReplicas: 2}},
		Conditions: []metav1.Condition{{Type: cachev1alpha1.ConditionDegraded, Status: metav1.ConditionFalse}},
	})
	m := NewProfileMetrics(reg, fake.NewClientBuilder().WithScheme(metricsScheme(t)).WithObjects(p).Build())
	m.Seen(p.Name)
	problems, err := metriclint.Problems(prometheus.Gatherers{reg, ctrlmetrics.Registry}, BoundedMetricLabels())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

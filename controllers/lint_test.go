package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cachetier/cachetier/internal/metriclint"
)

// TestMetricNamesFollowConventions lints the operator's own metrics and
// what controller-runtime registers on the registry the manager serves
// (controllers/integration lints it again once a controller has run, when
// controller-runtime's per-controller series exist).
func TestMetricNamesFollowConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewProfileMetrics(reg)
	if err := metriclint.Populate(m.shardReady, m.condition); err != nil {
		t.Fatal(err)
	}
	problems, err := metriclint.Problems(prometheus.Gatherers{reg, ctrlmetrics.Registry}, BoundedMetricLabels())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

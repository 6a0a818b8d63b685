package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cachetier/cachetier/internal/metriclint"
)

// boundedLabels are the cache-server's label names; each takes a bounded
// set of values: a profile's resources, HTTP verbs and codes, hash shard
// indexes (at most 1024) or a fleet's shard names (at most 64), a
// resource's indexed fields (a profile's fieldIndexes, at most 16, and the
// apiserver's own), and the
// fixed outcome/type/reason/path/result values the code sets; version is
// go_info's (one value per binary); priority_level the cluster's
// PriorityLevelConfigurations (a handful, as kube-apiserver's
// apiserver_flowcontrol_* series carry); kind the kinds of read work
// (seatcpu.Kind: list, watch-list).
var boundedLabels = []string{"verb", "resource", "code", "outcome", "type", "reason", "shard", "path", "result", "version", "index", "review", "priority_level", "kind"}

// TestMetricNamesFollowConventions lints everything a cache-server
// registers (its own metrics and Go's runtime and process collectors, as
// serving.Registry does), with every vector populated so nothing escapes.
func TestMetricNamesFollowConventions(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	New(rec)
	if err := metriclint.Populate(rec.collectors...); err != nil {
		t.Fatal(err)
	}
	problems, err := metriclint.Problems(reg, boundedLabels)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

package apf

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"
)

// The library's apiserver_flowcontrol_* metrics register in
// component-base's process-wide legacy registry, which the tier's
// /metrics did not serve. Gatherer serves the ones that tell an operator
// what priority and fairness does — requests rejected, queued, waiting
// and executing per priority level and flow schema, the seats of each
// level and the seats requests were charged — by their names under which
// kube-apiserver exports them, so its dashboards and queries apply. The
// legacy registry also holds Go's and the process' collectors (the tier's
// own registry has those) and whatever else a library registered; those
// are not served.
//
// The registry is process-wide: two tiers in one process (the tests'
// standalone and fleet front) share these series.

// Exported are the metric families served.
var Exported = []string{
	"apiserver_flowcontrol_rejected_requests_total",
	"apiserver_flowcontrol_dispatched_requests_total",
	"apiserver_flowcontrol_current_inqueue_requests",
	"apiserver_flowcontrol_current_inqueue_seats",
	"apiserver_flowcontrol_current_executing_requests",
	"apiserver_flowcontrol_current_executing_seats",
	"apiserver_flowcontrol_request_wait_duration_seconds",
	"apiserver_flowcontrol_request_execution_seconds",
	"apiserver_flowcontrol_nominal_limit_seats",
	"apiserver_flowcontrol_current_limit_seats",
	"apiserver_flowcontrol_work_estimated_seats",
}

// Gatherer gathers the Exported families from the legacy registry.
func Gatherer() prometheus.Gatherer {
	return filtered{legacyregistry.DefaultGatherer}
}

type filtered struct{ g prometheus.Gatherer }

func (f filtered) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := f.g.Gather()
	out := mfs[:0]
	for _, mf := range mfs {
		for _, name := range Exported {
			if mf.GetName() == name {
				out = append(out, mf)
				break
			}
		}
	}
	return out, err
}

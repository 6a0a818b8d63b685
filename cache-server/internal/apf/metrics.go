package apf

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
)

// The library's apiserver_flowcontrol_* metrics register in
// component-base's process-wide legacy registry, which the tier's
// /metrics did not serve. Gatherer serves the families listed in
// metrics.FlowControl, under the names kube-apiserver exports them by.
// The legacy registry also holds Go's and the process' collectors (the
// tier's own registry has those) and whatever else a library registered;
// those are not served.
//
// The registry is process-wide: two tiers in one process (the tests'
// standalone and fleet front) share these series.

// Gatherer gathers the metrics.FlowControl families from the legacy
// registry.
func Gatherer() prometheus.Gatherer {
	return filtered{legacyregistry.DefaultGatherer}
}

type filtered struct{ g prometheus.Gatherer }

func (f filtered) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := f.g.Gather()
	out := mfs[:0]
	for _, mf := range mfs {
		if _, ok := metrics.FlowControl[mf.GetName()]; ok {
			out = append(out, mf)
		}
	}
	return out, err
}

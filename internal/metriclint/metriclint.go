// Package metriclint checks exported metrics against Prometheus' naming
// conventions (client_golang's promlint: units in names, _total counters,
// help text, no camelCase) and cachetier's own rule that every label takes
// a bounded set of values: no per-object, per-user or per-request labels.
// The cache-server's and the operator's tests run it over everything they
// register.
package metriclint

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
)

// Populate creates one child of every vector collector, so that a metric
// nobody has touched yet is gathered (and linted) too: an empty vector
// exports nothing.
func Populate(cs ...prometheus.Collector) error {
	for _, c := range cs {
		var try func(lvs ...string) error
		switch v := c.(type) {
		case *prometheus.CounterVec:
			try = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.GaugeVec:
			try = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.HistogramVec:
			try = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		case *prometheus.SummaryVec:
			try = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
		default:
			continue
		}
		// The vector's label count is not exported; the right count is the
		// one its constructor accepts.
		var lvs []string
		for try(lvs...) != nil {
			if len(lvs) > 16 {
				return fmt.Errorf("cannot create a child of %T", c)
			}
			lvs = append(lvs, "x")
		}
	}
	return nil
}

// Problems gathers g and returns every promlint problem, plus every label
// whose name is not in bounded (the labels known to take few values).
func Problems(g prometheus.Gatherer, bounded []string) ([]string, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	l := promlint.NewWithMetricFamilies(mfs)
	l.AddCustomValidations(func(mf *dto.MetricFamily) []error {
		var errs []error
		seen := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if n := lp.GetName(); !seen[n] && !slices.Contains(bounded, n) {
					seen[n] = true
					errs = append(errs, fmt.Errorf("label %q is not known to be bounded (add it to the allowed labels only if its values are)", n))
				}
			}
		}
		return errs
	})
	problems, err := l.Lint()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range problems {
		out = append(out, p.Metric+": "+p.Text)
	}
	return out, nil
}

package metriclint

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestFindsProblems: the lint reports what it is for, including metrics
// that were never touched (populated first).
func TestFindsProblems(t *testing.T) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cachetier_requests", Help: "no _total"}, []string{"verb"}),
		prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cachetier_wait_milliseconds", Help: "not a base unit"}, []string{"resource"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cachetier_latency_seconds", Help: "per user"}, []string{"user"}),
		prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "cachetier_ok", Help: "fine"}, []string{"resource", "verb"}),
	}
	reg.MustRegister(cs...)
	if err := Populate(cs...); err != nil {
		t.Fatal(err)
	}
	got, err := Problems(reg, []string{"verb", "resource"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cachetier_requests: counter metrics should have \"_total\" suffix",
		"cachetier_wait_milliseconds: use base unit \"seconds\" instead of \"milliseconds\"",
		"cachetier_latency_seconds: label \"user\" is not known to be bounded",
	} {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, want) }) {
			t.Errorf("no problem %q in %q", want, got)
		}
	}
	if slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, "cachetier_ok") }) {
		t.Errorf("a conforming metric was reported: %q", got)
	}
}

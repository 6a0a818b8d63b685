package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInitResourceExportsZeros: after InitResource the known series exist
// with value 0, before anything increments them.
func TestInitResourceExportsZeros(t *testing.T) {
	m := New(prometheus.NewRegistry())
	m.InitResource("/v1/configmaps")
	for name, c := range map[string]prometheus.Collector{
		"cachetier_upstream_relists_total":             m.UpstreamRelists,
		"cachetier_upstream_watchlist_fallbacks_total": m.UpstreamWatchListFallbacks,
		"cachetier_watchers_terminated_total":          m.WatchersTerminated,
	} {
		if n := testutil.CollectAndCount(c, name); n == 0 {
			t.Errorf("%s: no series after InitResource", name)
		}
	}
	if v := testutil.ToFloat64(m.UpstreamRelists.WithLabelValues("/v1/configmaps", "startup")); v != 0 {
		t.Errorf("relists{startup} = %g, want 0", v)
	}
	if v := testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("/v1/configmaps", "slow")); v != 0 {
		t.Errorf("watchers terminated{slow} = %g, want 0", v)
	}
}

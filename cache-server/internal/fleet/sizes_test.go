package fleet

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// TestShardSeatCPU: a front charges the mean of the CPU per seat's worth
// of work its shards report (a read's work is split among them), leaves
// out a shard that reports none (an older version) and exports it.
func TestShardSeatCPU(t *testing.T) {
	f := newMergeFixture(t)
	if got := f.s.ShardSeatCPU(); got != 0 {
		t.Fatalf("before any report: %v", got)
	}
	sz := store.Sizes{Objects: 10, Bytes: 1000}
	f.s.setSizes(0, sz, 200*time.Microsecond)
	f.s.setSizes(1, sz, 400*time.Microsecond)
	f.s.setSizes(2, sz, 0)
	if got := f.s.ShardSeatCPU(); got != 300*time.Microsecond {
		t.Fatalf("shards at 200 µs, 400 µs and unknown: %v, want 300µs", got)
	}
	if got := testutil.ToFloat64(f.m.FleetShardSeatCPU.WithLabelValues(f.s.label)); got != 300e-6 {
		t.Errorf("cachetier_fleet_shard_seat_cpu_seconds %g, want 0.0003", got)
	}
	if objects, _ := f.s.Count("", store.IndexValue{}); objects != 30 {
		t.Errorf("the sizes: %d objects, want 30", objects)
	}
}

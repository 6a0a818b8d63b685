package fleet

import (
	"time"

	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// A front holds no objects; what a read walks is estimated from the sizes
// each shard sends on its change stream every few seconds
// (shardwire.Header.Sizes): the resource's objects and bytes exactly, a
// namespace's or an indexed value's objects as the average per namespace
// or per value (the shards know the exact counts, but asking them would
// put a round trip in front of every request).

var (
	_ front.Sizer       = (*Source)(nil)
	_ front.ShardCoster = (*Source)(nil)
)

// setSizes records shard i's sizes and CPU per seat's worth of work (0:
// not reported, a shard of an older version).
func (s *Source) setSizes(i int, sz store.Sizes, seatCPU time.Duration) {
	s.mu.Lock()
	s.sizes[i], s.seatCPU[i] = sz, seatCPU
	s.mu.Unlock()
	s.metrics.FleetShardSeatCPU.WithLabelValues(s.label).Set(s.ShardSeatCPU().Seconds())
}

// ShardSeatCPU is the CPU the shards take per seat's worth of a read's
// work, beside the front's own: the mean of what they report. A read's
// work is split among the shards by hash, each doing its share at its
// own cost, so the fleet's CPU for a read is its work times the mean.
func (s *Source) ShardSeatCPU() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum time.Duration
	var n int
	for _, d := range s.seatCPU {
		if d > 0 {
			sum += d
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / time.Duration(n)
}

// Count estimates the objects a read of namespace ns ("" = all) restricted
// to iv walks, and their bytes.
func (s *Source) Count(ns string, iv store.IndexValue) (objects, bytes int64) {
	s.mu.Lock()
	var total store.Sizes
	for _, sz := range s.sizes {
		total.Objects += sz.Objects
		total.Bytes += sz.Bytes
		total.Namespaces = max(total.Namespaces, sz.Namespaces)
		if v := sz.Values[iv.Field]; iv.Field != "" && v > 0 {
			if total.Values == nil {
				total.Values = map[string]int{}
			}
			total.Values[iv.Field] = max(total.Values[iv.Field], v)
		}
	}
	s.mu.Unlock()
	return Estimate(total, ns, iv)
}

// Estimate is what a read of ns restricted to iv walks, by averages over
// sz: the namespace's share of the objects, the value's, or the smaller.
func Estimate(sz store.Sizes, ns string, iv store.IndexValue) (objects, bytes int64) {
	objects = sz.Objects
	if ns != "" && sz.Namespaces > 0 {
		objects = ceilDiv(sz.Objects, int64(sz.Namespaces))
	}
	if v := sz.Values[iv.Field]; iv.Field != "" && v > 0 {
		objects = min(objects, ceilDiv(sz.Objects, int64(v)))
	}
	if sz.Objects > 0 {
		bytes = sz.Bytes * objects / sz.Objects
	}
	return objects, bytes
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

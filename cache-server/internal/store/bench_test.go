package store

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkHistoryBytesPerChange reports the heap that each retained
// history state costs: a store of 10k objects (4 shards, as hack/bench's
// profile) takes 1000 modifications within its history window, and the
// live heap growth divided by the number of changes is the copy-on-write
// B-tree path each change duplicates (the objects themselves are shared).
// One iteration is one run; use -benchtime=1x.
func BenchmarkHistoryBytesPerChange(b *testing.B) {
	for b.Loop() {
		s, err := New(Options{Shards: 4, HistoryWindow: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		objs := make([]*Object, 10000)
		for i := range objs {
			objs[i] = &Object{Key: fmt.Sprintf("bench/cm-%06d", i), RV: 1, Raw: []byte("{}")}
		}
		if _, err := s.Replace(objs, 1); err != nil {
			b.Fatal(err)
		}
		const changes = 1000
		mods := make([]*Object, changes)
		for i := range mods {
			mods[i] = &Object{Key: objs[(i*7919)%len(objs)].Key, RV: uint64(2 + i), Raw: []byte("{}")}
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, o := range mods {
			if err := s.Apply(Event{Type: Modified, Object: o, RV: o.RV}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/changes, "heapB/change")
		runtime.KeepAlive(s)
	}
}

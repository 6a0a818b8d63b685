package watch

import (
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// BenchmarkDispatch measures what dispatching one pod update costs with W
// kubelet-like watchers (fieldSelector=spec.nodeName=<node>, one per
// node up to 500 nodes, then several per node) plus 10 unindexed watchers
// whose label selector matches nothing: 10,000 pods over 500 nodes, one
// pod updated per event (it stays on its node), every watcher read by its
// own goroutine as the front's handlers do. Events are published every
// benchInterval (the scenario is 100 updates/s), each after the
// previous one reached its node's watchers, so a watcher never gets
// events in bulk and each event's cost is paid in full.
//
// Reported: cpu-us/event, the process's CPU time (user+system: publisher,
// every woken watcher, GC) per event — W=0 (no watchers) is what the
// harness itself costs (applying to the store, pacing), to subtract; p50-us and p99-us, from publishing
// an event to its node's watcher reading it. The lines marked "index"
// are the only ones that need the index; without them the benchmark runs
// on a hub that has none.
//
//	go test ./cache-server/internal/watch -run '^$' -bench Dispatch -benchtime 1000x
func BenchmarkDispatch(b *testing.B) {
	b.Run("W=0", func(b *testing.B) { benchDispatch(b, 0, 0) }) // the harness alone
	for _, w := range []int{1, 500, 2000} {
		b.Run(fmt.Sprintf("W=%d", w), func(b *testing.B) { benchDispatch(b, w, 10) })
	}
}

const (
	benchPods     = 10000
	benchNodes    = 500
	benchInterval = 4 * time.Millisecond
)

func benchNode(i int) string { return fmt.Sprintf("node-%d", i%benchNodes) }

func benchPod(i int, rv uint64) *store.Object {
	name := fmt.Sprintf("pod-%d", i)
	return &store.Object{
		Key: keyhash.Key("ns", name), Namespace: "ns", Name: name, RV: rv,
		Labels: map[string]string{"app": "web"}, Fields: map[string]string{"spec.nodeName": benchNode(i)},
		Raw: fmt.Appendf(nil, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":"ns","resourceVersion":"%d"},"spec":{"nodeName":%q}}`, name, rv, benchNode(i)),
	}
}

func benchDispatch(b *testing.B, watchers, unindexed int) {
	st, err := store.New(store.Options{Shards: 4, HistoryWindow: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	rv := uint64(100)
	objs := make([]*store.Object, benchPods)
	for i := range objs {
		objs[i] = benchPod(i, rv)
	}
	evs, err := st.Replace(objs, rv)
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{Store: st}
	opts.FieldIndexes = []string{"spec.nodeName"} // index
	hub := New(opts)
	hub.Relist(evs, rv)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// got has a value for every event a node-scoped watcher read.
	got := make(chan struct{}, 1<<16)
	perNode := make([]int, benchNodes)
	latencies := make([][]time.Duration, watchers)
	start := func(req Request, lat *[]time.Duration) {
		w, err := hub.Watch(req)
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			var out []Out
			for {
				out, err = w.Next(stop, out[:0])
				if err != nil || len(out) == 0 {
					return // terminated or stopped
				}
				now := time.Now()
				for _, o := range out {
					if lat != nil {
						*lat = append(*lat, now.Sub(o.Received))
						got <- struct{}{}
					}
				}
			}
		}()
	}
	for i := range watchers {
		node := benchNode(i)
		perNode[i%benchNodes]++
		req := Request{Match: func(o *store.Object) bool { return o.Fields["spec.nodeName"] == node }}
		req.Index = store.IndexValue{Field: "spec.nodeName", Value: node} // index
		start(req, &latencies[i])
	}
	for range unindexed {
		start(Request{Match: func(o *store.Object) bool { return o.Labels["app"] == "batch" }}, nil)
	}

	tick := time.NewTicker(benchInterval)
	defer tick.Stop()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for n := range b.N {
		i := (n * 7919) % benchPods
		rv++
		ev := store.Event{Type: store.Modified, Object: benchPod(i, rv), RV: rv}
		if err := st.Apply(ev); err != nil {
			b.Fatal(err)
		}
		hub.Publish([]store.Event{ev})
		for k := range perNode[i%benchNodes] {
			select {
			case <-got:
			case <-time.After(10 * time.Second):
				b.Fatalf("event %d: %d of its node's watchers did not get it", n, perNode[i%benchNodes]-k)
			}
		}
		<-tick.C
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	close(stop)
	wg.Wait()
	all := slices.Concat(latencies...)
	slices.Sort(all)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/event")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-us")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-us")
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package fleet

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// The list path between shards and a front, in one process: shards
// answering from stores over HTTPS on loopback (shardserver.ListStore,
// the real wire format and S2 negotiation), the front's merge
// (Source.StreamItems, Source.List). Not covered: the front's response
// encoding (package front's benchmarks) and the shards' freshness waits.
// cpu-ns/op is the process's CPU time (user+system) per LIST, shards and
// front together: what hack/bench sums over a fleet's processes.

func benchObjects(n, size int) []*store.Object {
	payload := strings.Repeat("x", size)
	objs := make([]*store.Object, n)
	for i := range objs {
		name := fmt.Sprintf("cm-%06d", i)
		raw := fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"bench","uid":"0c3c9f55-4f2a-4d8f-9d5e-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-21T10:00:00Z","managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-11-21T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:payload":{}}}}]},"data":{"payload":%q}}`,
			name, i, 1000+i, payload)
		objs[i] = &store.Object{Key: keyhash.Key("bench", name), Namespace: "bench", Name: name, RV: uint64(1000 + i), Raw: []byte(raw)}
	}
	return objs
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchFleetList(b *testing.B, shards int, plain bool, limit int64) {
	objs := benchObjects(10000, 1024)
	f := newListFixtureCompressing(b, shards, objs, plain)
	for st := range f.compress {
		f.compress[st] = !plain
	}
	read := func() {
		req := store.ListRequest{SnapshotRV: listRV, Namespace: "bench", Limit: limit}
		for {
			res, err := f.src.StreamItems(req, nil, func([]byte, uint64) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			if res.ContinueKey == "" {
				return
			}
			req.StartKeyExclusive, req.RemainingAfterStart = res.ContinueKey, res.RemainingItemCount
		}
	}
	read()
	f.sent.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for b.Loop() {
		read()
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(f.sent.Load())/float64(b.N), "wireB/op")
}

func BenchmarkFleetList10kx1KiB(b *testing.B) {
	for _, shards := range []int{2, 4} {
		for _, plain := range []bool{true, false} {
			for _, limit := range []int64{0, 500} {
				b.Run(fmt.Sprintf("shards=%d/s2=%v/limit=%d", shards, !plain, limit), func(b *testing.B) { benchFleetList(b, shards, plain, limit) })
			}
		}
	}
}

package fleet

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// The merge of the shards' change streams is driven here by calling
// restart (a stream's first watermark) and advance (a later watermark or
// an event) directly, as Source.stream does; no shard is ever called.

const testResource = "configmaps"

type mergeFixture struct {
	t    *testing.T
	s    *Source
	m    *metrics.Metrics
	topo *topology.Topology
}

func newMergeFixture(t *testing.T) *mergeFixture {
	topo := &topology.Topology{HashShards: 6, Shards: []topology.Shard{
		{Name: "s0", FirstHashShard: 0, LastHashShard: 1, Replicas: 1, Endpoints: []string{"s0.invalid:8443"}},
		{Name: "s1", FirstHashShard: 2, LastHashShard: 3, Replicas: 1, Endpoints: []string{"s1.invalid:8443"}},
		{Name: "s2", FirstHashShard: 4, LastHashShard: 5, Replicas: 1, Endpoints: []string{"s2.invalid:8443"}},
	}}
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	s := NewSource(Options{
		Entry:  catalog.Entry{Resource: upstream.Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: testResource}, Kind: "ConfigMap", Namespaced: true}},
		Client: NewClient(&http.Client{}, topo, m), Metrics: m,
	})
	return &mergeFixture{t: t, s: s, m: m, topo: topo}
}

// ev is an ADDED event at rv of an object owned by shard i (its key
// hashes into the shard's range), with a key unique to rv.
func (f *mergeFixture) ev(i int, rv uint64) *store.Event {
	f.t.Helper()
	for n := 0; n < 10000; n++ {
		name := fmt.Sprintf("o%d-%d", rv, n)
		key := keyhash.Key("ns", name)
		if f.topo.ShardOf(keyhash.Shard(key, int(f.topo.HashShards))) == i {
			o := &store.Object{Key: key, Namespace: "ns", Name: name, RV: rv, Raw: fmt.Appendf(nil, `{"metadata":{"name":%q,"resourceVersion":"%d"}}`, name, rv)}
			return &store.Event{Type: store.Added, Object: o, RV: rv}
		}
	}
	f.t.Fatalf("no key for shard %d", i)
	return nil
}

// event sends an event of shard i at rv.
// As a shard sends a single change: the event, then (caught up) its RV as
// the watermark.
func (f *mergeFixture) event(i int, rv uint64) {
	f.s.advance(i, rv, f.ev(i, rv))
	f.s.advance(i, rv, nil)
}

// watermark sends a watermark of shard i.
func (f *mergeFixture) watermark(i int, rv uint64) { f.s.advance(i, rv, nil) }

func (f *mergeFixture) synced() bool {
	select {
	case <-f.s.Synced():
		return true
	default:
		return false
	}
}

func (f *mergeFixture) watch(req watch.Request) *watch.Watcher {
	f.t.Helper()
	w, err := f.s.Hub().Watch(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	return w
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// follow returns what a hub follower has now: the events' RVs and the
// watermark ("rv rv ... | wm").
func (f *mergeFixture) follow(w *watch.Watcher) string {
	f.t.Helper()
	evs, wm, err := w.Follow(closedChan(), nil)
	if err != nil {
		f.t.Fatalf("Follow: %v", err)
	}
	var parts []string
	for _, e := range evs {
		if e.Object.RV != e.RV {
			f.t.Fatalf("event %d carries object %s@%d", e.RV, e.Object.Name, e.Object.RV)
		}
		parts = append(parts, fmt.Sprint(e.RV))
	}
	return fmt.Sprintf("%s | %d", strings.Join(parts, " "), wm)
}

// next returns what a client watcher gets now.
func (f *mergeFixture) next(w *watch.Watcher) string {
	f.t.Helper()
	out, err := w.Next(closedChan(), nil)
	if err != nil {
		f.t.Fatalf("Next: %v", err)
	}
	var parts []string
	for _, o := range out {
		parts = append(parts, fmt.Sprintf("%s@%d", o.Type, o.RV))
	}
	return strings.Join(parts, " ")
}

func (f *mergeFixture) expectLastRV(rv uint64) {
	f.t.Helper()
	if got := f.s.Hub().LastRV(); got != rv {
		f.t.Fatalf("hub LastRV %d, want %d", got, rv)
	}
	if got := f.s.AppliedRV(); got != rv {
		f.t.Fatalf("AppliedRV %d, want %d", got, rv)
	}
}

func TestMergeStartsOnceEveryShardStarted(t *testing.T) {
	f := newMergeFixture(t)
	f.s.restart(0, 100)
	f.event(0, 101) // queued before the start; at or below it: dropped
	f.event(0, 107) // above the start: kept
	if f.synced() || f.s.Hub().LastRV() != 0 {
		t.Fatal("started with one stream of three")
	}
	f.s.restart(1, 105)
	f.event(1, 106)
	if f.synced() || f.s.Hub().LastRV() != 0 {
		t.Fatal("started with two streams of three")
	}
	f.s.restart(2, 104)
	f.event(2, 104) // at or below the stream's own start: ignored
	if !f.synced() {
		t.Fatal("not started once every stream reported its first watermark")
	}
	// The highest of the starting points.
	f.expectLastRV(105)
	if got := testutil.ToFloat64(f.m.FleetWatermark.WithLabelValues(testResource, "s0")); got != 107 {
		t.Fatalf("watermark gauge of s0: %v", got)
	}

	w := f.watch(watch.Request{})
	if w.SnapshotRV != 105 {
		t.Fatalf("a watch from now starts at %d", w.SnapshotRV)
	}
	client := f.watch(watch.Request{})
	// Watermarks now s0 107, s1 106, s2 104: nothing is known complete
	// past 105 yet.
	if got := f.follow(w); got != " | 0" {
		t.Fatalf("before every shard passed the start: %q", got)
	}
	f.watermark(2, 108) // s2 108: the lowest is s1's 106
	if got := f.follow(w); got != "106 | 106" {
		t.Fatalf("got %q, want 106 | 106", got)
	}
	f.watermark(1, 110) // lowest s0 107
	if got := f.follow(w); got != "107 | 107" {
		t.Fatalf("got %q, want 107 | 107", got)
	}
	f.expectLastRV(107)
	if got := f.next(client); got != "ADDED@106 ADDED@107" {
		t.Fatalf("client watcher got %q", got)
	}
}

// Restarts of a stream before every stream started only move its own
// starting point and drop what it queued.
func TestMergeRestartBeforeStart(t *testing.T) {
	f := newMergeFixture(t)
	f.s.restart(0, 100)
	f.event(0, 103)
	f.s.restart(0, 102) // reopened from now: its queue is gone
	f.s.restart(1, 101)
	f.s.restart(2, 101)
	if !f.synced() {
		t.Fatal("not started")
	}
	f.expectLastRV(102)
	w := f.watch(watch.Request{})
	f.watermark(0, 110)
	f.watermark(1, 110)
	f.watermark(2, 110)
	if got := f.follow(w); got != " | 110" {
		t.Fatalf("got %q; the queue of the restarted stream was published", got)
	}
}

// Events are published in RV order across shards, each once, and only when
// every shard's watermark reached it.
func TestMergeOrderAndWatermarkGate(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	f.expectLastRV(100)
	w := f.watch(watch.Request{})
	client := f.watch(watch.Request{})
	resumed := f.watch(watch.Request{From: 100})

	steps := []struct {
		do   func()
		want string
	}{
		{func() { f.event(0, 101) }, " | 0"},                  // wm 101 100 100
		{func() { f.event(1, 102) }, " | 0"},                  // wm 101 102 100
		{func() { f.event(2, 103) }, "101 | 101"},             // wm 101 102 103
		{func() { f.event(0, 104) }, "102 | 102"},             // wm 104 102 103
		{func() { f.event(1, 105) }, "103 | 103"},             // wm 104 105 103
		{func() { f.watermark(2, 106) }, "104 | 104"},         // wm 104 105 106
		{func() { f.watermark(0, 106) }, "105 | 105"},         // wm 106 105 106
		{func() { f.watermark(1, 106) }, " | 106"},            // wm 106 106 106
		{func() { f.watermark(1, 107) }, " | 0"},              // wm 106 107 106
		{func() { f.watermark(0, 105) }, " | 0"},              // an old watermark changes nothing
		{func() { f.event(1, 108) }, " | 0"},                  // wm 106 108 106
		{func() { f.event(1, 109) }, " | 0"},                  // wm 106 109 106
		{func() { f.event(0, 107) }, " | 0"},                  // wm 107 109 106
		{func() { f.watermark(0, 111) }, " | 0"},              // wm 111 109 106
		{func() { f.watermark(2, 112) }, "107 108 109 | 109"}, // one batch, sorted across shards
		{func() { f.event(0, 106) }, " | 0"},                  // at or below its own watermark: ignored
	}
	for k, step := range steps {
		step.do()
		if got := f.follow(w); got != step.want {
			t.Fatalf("step %d: got %q, want %q", k, got, step.want)
		}
	}
	f.expectLastRV(109)
	want := "ADDED@101 ADDED@102 ADDED@103 ADDED@104 ADDED@105 ADDED@107 ADDED@108 ADDED@109"
	if got := f.next(client); got != want {
		t.Fatalf("client watcher:\n got  %s\n want %s", got, want)
	}
	if got := f.next(resumed); got != want {
		t.Fatalf("watcher from 100:\n got  %s\n want %s", got, want)
	}
	// The history is resumable from any published RV.
	from := f.watch(watch.Request{From: 104})
	if got := f.next(from); got != "ADDED@105 ADDED@107 ADDED@108 ADDED@109" {
		t.Fatalf("watch from 104: %s", got)
	}
}

// Events of the same shard may arrive in the same flush as the watermark
// that releases them and several shards' queues are merged.
func TestMergeBatchAcrossShards(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	w := f.watch(watch.Request{})
	for rv := uint64(101); rv <= 130; rv++ {
		f.event(int(rv%3), rv) // round robin
	}
	// s0 has 102..129 (wm 129), s1 up to 130, s2 up to 128: 101..128.
	got := f.follow(w)
	var want []string
	for rv := 101; rv <= 128; rv++ {
		want = append(want, fmt.Sprint(rv))
	}
	if got != strings.Join(want, " ")+" | 128" {
		t.Fatalf("got %q", got)
	}
	f.watermark(2, 131) // s0 still at 129
	if got := f.follow(w); got != "129 | 129" {
		t.Fatalf("got %q", got)
	}
	f.watermark(0, 131)
	if got := f.follow(w); got != "130 | 130" {
		t.Fatalf("got %q", got)
	}
}

// A shard's stream restarting from now after the hub started means its
// changes in between are lost: the hub is reset at the new floor, its
// watchers are closed, and events at or below the floor still queued from
// other shards are not published.
func TestMergeShardRestartResetsHub(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	w := f.watch(watch.Request{})
	client := f.watch(watch.Request{})
	f.event(0, 101)
	f.event(1, 102)
	f.watermark(0, 105)
	f.watermark(1, 105)
	f.watermark(2, 105)
	if got := f.follow(w); got != "101 102 | 105" {
		t.Fatalf("got %q", got)
	}
	// Queued, not yet published: s2 is behind.
	f.event(0, 110)
	f.event(1, 120)
	f.watermark(0, 125)
	f.watermark(1, 125)

	f.s.restart(2, 130)

	if _, _, err := w.Follow(closedChan(), nil); err != watch.ErrTerminated {
		t.Fatalf("follower after the restart: %v", err)
	}
	if _, err := client.Next(closedChan(), nil); err != watch.ErrTerminated {
		t.Fatalf("client watcher after the restart: %v", err)
	}
	if got := testutil.ToFloat64(f.m.WatchersTerminated.WithLabelValues(testResource, "shard_restart")); got != 2 {
		t.Fatalf("terminated{shard_restart} = %v", got)
	}
	f.expectLastRV(130)
	// Clients resuming from before the floor relist.
	for _, from := range []uint64{100, 105, 120, 129} {
		if _, err := f.s.Hub().Watch(watch.Request{From: from}); !apierrors.IsResourceExpired(err) {
			t.Fatalf("watch from %d: want 410, got %v", from, err)
		}
	}
	w2 := f.watch(watch.Request{})
	resumed := f.watch(watch.Request{From: 130})
	if w2.SnapshotRV != 130 {
		t.Fatalf("watch from now starts at %d", w2.SnapshotRV)
	}
	f.event(2, 131)
	f.event(0, 132)
	f.watermark(0, 140)
	f.watermark(1, 140)
	f.watermark(2, 140)
	if got := f.follow(w2); got != "131 132 | 140" {
		t.Fatalf("after the restart: got %q; want only events after the floor 130", got)
	}
	if got := f.next(resumed); got != "ADDED@131 ADDED@132" {
		t.Fatalf("watcher from 130: %q", got)
	}
}

// A stream that restarts at an RV below the hub's keeps the hub's RV (it
// never goes back) and holds publishing until it catches up.
func TestMergeShardRestartBelowHub(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	for i := range 3 {
		f.watermark(i, 120)
	}
	f.expectLastRV(120)
	old := f.watch(watch.Request{})
	f.s.restart(1, 110) // e.g. another replica, a little behind
	f.expectLastRV(120)
	if _, _, err := old.Follow(closedChan(), nil); err != watch.ErrTerminated {
		t.Fatalf("old watcher: %v", err)
	}
	w := f.watch(watch.Request{From: 120})
	f.watermark(0, 130)
	f.watermark(2, 130)
	f.watermark(1, 118)
	if got := f.follow(w); got != " | 0" {
		t.Fatalf("published before the restarted shard caught up: %q", got)
	}
	f.event(1, 125)
	f.watermark(1, 130)
	if got := f.follow(w); got != "125 | 130" {
		t.Fatalf("got %q", got)
	}
}

// At the start, the hub begins at the highest stream's starting point. A
// stream that started lower then sends its changes between its own start
// and the hub's: those are part of the state at the hub's start (a list
// at that RV has them), so they must be dropped like the ones queued before
// the start. advance only drops events at or below the stream's own
// watermark, so they are queued and later published below the hub's RV.
func TestMergeDropsLateEventsBelowStart(t *testing.T) {
	f := newMergeFixture(t)
	f.s.restart(0, 100)
	f.s.restart(1, 105)
	f.s.restart(2, 104)
	f.expectLastRV(105)
	w := f.watch(watch.Request{})
	f.event(0, 103) // s0 was at 100: this is its change at 103
	f.event(2, 105) // at the start
	f.event(1, 107)
	for i := range 3 {
		f.watermark(i, 110)
	}
	if got := f.follow(w); got != "107 | 110" {
		t.Fatalf("got %q, want only 107: events at or below the start 105 were published", got)
	}
}

// The same after a reset: events of other shards at or below the new floor
// that arrive after the restart must not be published either.
func TestMergeDropsLateEventsBelowResetFloor(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	for i := range 3 {
		f.watermark(i, 110)
	}
	f.s.restart(1, 130)
	f.expectLastRV(130)
	w := f.watch(watch.Request{})
	f.event(0, 120) // s0 was at 110: its change at 120, below the floor
	f.event(2, 135)
	for i := range 3 {
		f.watermark(i, 140)
	}
	if got := f.follow(w); got != "135 | 140" {
		t.Fatalf("got %q, want only 135: an event below the reset floor 130 was published", got)
	}
}

// Events sharing one RV (a relist difference) are held until the shard's
// watermark says the RV is complete, even when every other shard is past
// it: a watcher must never see part of the group and a bookmark at its RV.
func TestMergeHoldsAnRVGroupUntilItsWatermark(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	w := f.watch(watch.Request{})
	f.watermark(1, 120)
	f.watermark(2, 120)
	f.s.advance(0, 110, f.ev(0, 110))
	f.s.advance(0, 110, f.ev(0, 110))
	if got := f.follow(w); got != " | 109" {
		t.Fatalf("part of the group at 110 was released: %q", got)
	}
	f.s.advance(0, 110, f.ev(0, 110))
	f.watermark(0, 110)
	if got := f.follow(w); got != "110 110 110 | 110" {
		t.Fatalf("got %q, want the whole group at 110", got)
	}
}

// A change a shard publishes at an RV its stream already covered (a
// namespace entering the namespaceSelector: standalone's hub publishes it at
// its current RV) reaches the front's watchers.
func TestMergePassesDifferencesAtTheCurrentRV(t *testing.T) {
	f := newMergeFixture(t)
	for i := range 3 {
		f.s.restart(i, 100)
	}
	client := f.watch(watch.Request{})
	for i := range 3 {
		f.watermark(i, 105)
	}
	f.s.advance(1, 105, f.ev(1, 105)) // at the merged RV: published now
	if got := f.next(client); got != "ADDED@105" {
		t.Fatalf("a difference at the merged RV: %q", got)
	}
	f.watermark(1, 108)
	f.watermark(2, 108)
	f.s.advance(1, 108, f.ev(1, 108)) // above the merged RV (s0 at 105): waits
	if got := f.next(client); got != "" {
		t.Fatalf("released before shard 0 reached 108: %q", got)
	}
	f.watermark(0, 108)
	if got := f.next(client); got != "ADDED@108" {
		t.Fatalf("after every shard reached 108: %q", got)
	}
}

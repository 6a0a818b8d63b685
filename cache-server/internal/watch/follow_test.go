package watch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// closed is a stop channel that is already closed: Follow returns what it
// has instead of blocking.
func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func followNow(t *testing.T, w *Watcher) ([]Event, uint64) {
	t.Helper()
	evs, wm, err := w.Follow(closed(), nil)
	if err != nil {
		t.Fatalf("Follow: %v", err)
	}
	return evs, wm
}

func eventSummary(evs []Event) string {
	var parts []string
	for _, e := range evs {
		s := fmt.Sprintf("%s %s@%d", e.Type, e.Object.Name, e.RV)
		if e.Prev != nil {
			s += fmt.Sprintf(" (prev @%d)", e.Prev.RV)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

type followResult struct {
	evs []Event
	wm  uint64
	err error
}

// followAsync runs Follow in a goroutine.
func followAsync(w *Watcher, stop <-chan struct{}, out []Event) <-chan followResult {
	c := make(chan followResult, 1)
	go func() {
		evs, wm, err := w.Follow(stop, out)
		c <- followResult{evs, wm, err}
	}()
	return c
}

func waitResult(t *testing.T, c <-chan followResult) followResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Follow did not return")
		return followResult{}
	}
}

func assertBlocked(t *testing.T, c <-chan followResult) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("Follow returned without a change: %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestFollowEventsWithPrevInOrder(t *testing.T) {
	f := newFixture(t, Options{})
	// Follow is unfiltered: the watcher's namespace does not matter.
	w, err := f.hub.Watch(Request{Namespace: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.apply(store.Added, "ns", "a", nil)    // 101
	f.apply(store.Modified, "ns", "a", nil) // 102
	f.apply(store.Added, "ns", "b", nil)    // 103
	f.apply(store.Deleted, "ns", "a", nil)  // 104
	evs, wm := followNow(t, w)
	want := "ADDED a@101, MODIFIED a@102 (prev @101), ADDED b@103, DELETED a@104 (prev @102)"
	if got := eventSummary(evs); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if wm != 104 {
		t.Fatalf("watermark %d, want 104", wm)
	}
	// The previous states are the stored objects themselves.
	if evs[1].Prev != evs[0].Object || evs[3].Prev != evs[1].Object {
		t.Fatal("prev is not the previous event's object")
	}
	// Nothing new: nothing, not even the watermark again.
	if evs, wm := followNow(t, w); len(evs) != 0 || wm != 0 {
		t.Fatalf("repeated: %s wm=%d", eventSummary(evs), wm)
	}
	// Appends to out.
	seed := []Event{{Type: store.Added, RV: 1, Object: obj("x", "seed", 1, nil)}}
	f.apply(store.Added, "ns", "c", nil) // 105
	out, wm, err := w.Follow(closed(), seed)
	if err != nil || wm != 105 || eventSummary(out) != "ADDED seed@1, ADDED c@105" {
		t.Fatalf("append: %s wm=%d err=%v", eventSummary(out), wm, err)
	}
}

func TestFollowWatermarkWithoutEvents(t *testing.T) {
	f := newFixture(t, Options{})
	w, _ := f.hub.Watch(Request{})
	defer w.Stop()
	// At the hub's RV already: nothing to say.
	if evs, wm := followNow(t, w); len(evs) != 0 || wm != 0 {
		t.Fatalf("fresh watcher: %s wm=%d", eventSummary(evs), wm)
	}
	f.hub.Progress(150)
	if evs, wm := followNow(t, w); len(evs) != 0 || wm != 150 {
		t.Fatalf("after Progress(150): %s wm=%d", eventSummary(evs), wm)
	}
	// Progress backwards or to the same RV is no change.
	f.hub.Progress(150)
	f.hub.Progress(120)
	if evs, wm := followNow(t, w); len(evs) != 0 || wm != 0 {
		t.Fatalf("no progress: %s wm=%d", eventSummary(evs), wm)
	}
	// Events then a bookmark: the watermark is the newest of them.
	f.rv = 150
	f.apply(store.Added, "ns", "a", nil) // 151
	f.hub.Progress(160)
	evs, wm := followNow(t, w)
	if eventSummary(evs) != "ADDED a@151" || wm != 160 {
		t.Fatalf("got %s wm=%d", eventSummary(evs), wm)
	}
}

// The watermark comes only once every event up to it was returned: a long
// backlog is returned in batches, the watermark with the last one.
func TestFollowWatermarkOnlyWhenCaughtUp(t *testing.T) {
	f := newFixture(t, Options{})
	w, _ := f.hub.Watch(Request{})
	defer w.Stop()
	n := maxBatch + 44
	for i := range n {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 101..400
	}
	evs, wm := followNow(t, w)
	if len(evs) != maxBatch || wm != 0 {
		t.Fatalf("first batch: %d events, watermark %d; want %d and none", len(evs), wm, maxBatch)
	}
	rest, wm := followNow(t, w)
	if len(rest) != n-maxBatch || wm != f.rv {
		t.Fatalf("second batch: %d events, watermark %d; want %d and %d", len(rest), wm, n-maxBatch, f.rv)
	}
	all := append(evs, rest...)
	for i, e := range all {
		if e.RV != 101+uint64(i) {
			t.Fatalf("event %d has RV %d", i, e.RV)
		}
	}
}

// A follower resuming from an RV gets only what came after it.
func TestFollowFrom(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 4 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 101..104
	}
	w, err := f.hub.Watch(Request{From: 102})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	evs, wm := followNow(t, w)
	if eventSummary(evs) != "ADDED o2@103, ADDED o3@104" || wm != 104 {
		t.Fatalf("got %s wm=%d", eventSummary(evs), wm)
	}
	// From the head: only the watermark once it moves.
	w2, _ := f.hub.Watch(Request{From: 104})
	defer w2.Stop()
	if evs, wm := followNow(t, w2); len(evs) != 0 || wm != 0 {
		t.Fatalf("at head: %s wm=%d", eventSummary(evs), wm)
	}
}

func TestFollowBlocksUntilChange(t *testing.T) {
	f := newFixture(t, Options{})
	w, _ := f.hub.Watch(Request{})
	defer w.Stop()
	stop := make(chan struct{})
	defer close(stop)

	c := followAsync(w, stop, nil)
	assertBlocked(t, c)
	f.apply(store.Added, "ns", "a", nil) // 101
	r := waitResult(t, c)
	if r.err != nil || eventSummary(r.evs) != "ADDED a@101" || r.wm != 101 {
		t.Fatalf("got %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
	}

	// Progress alone wakes it with the watermark.
	c = followAsync(w, stop, nil)
	assertBlocked(t, c)
	f.hub.Progress(130)
	r = waitResult(t, c)
	if r.err != nil || len(r.evs) != 0 || r.wm != 130 {
		t.Fatalf("got %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
	}

	// An event at or below the watcher's start does not wake it with
	// anything to return (a follower from a future RV).
	w2, _ := f.hub.Watch(Request{From: 140})
	defer w2.Stop()
	c = followAsync(w2, stop, nil)
	f.hub.Progress(135) // not past 140, but a new RV: a watermark
	r = waitResult(t, c)
	if r.err != nil || len(r.evs) != 0 || r.wm != 135 {
		t.Fatalf("future watcher: %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
	}
	f.rv = 139
	f.apply(store.Added, "ns", "early", nil) // 140: not after 140
	f.apply(store.Added, "ns", "late", nil)  // 141
	evs, wm := followNow(t, w2)
	if eventSummary(evs) != "ADDED late@141" || wm != 141 {
		t.Fatalf("future watcher: %s wm=%d", eventSummary(evs), wm)
	}
}

func TestFollowReturnsOnStop(t *testing.T) {
	f := newFixture(t, Options{})
	w, _ := f.hub.Watch(Request{})
	defer w.Stop()
	stop := make(chan struct{})
	out := make([]Event, 0, 4)
	c := followAsync(w, stop, out)
	assertBlocked(t, c)
	close(stop)
	r := waitResult(t, c)
	if r.err != nil || r.wm != 0 || len(r.evs) != 0 || cap(r.evs) != 4 {
		t.Fatalf("got %s (cap %d) wm=%d err=%v", eventSummary(r.evs), cap(r.evs), r.wm, r.err)
	}
	// With a closed stop and something already in out: out as it was.
	seed := []Event{{Type: store.Added, RV: 7, Object: obj("ns", "seed", 7, nil)}}
	evs, wm, err := w.Follow(stop, seed)
	if err != nil || wm != 0 || len(evs) != 1 || evs[0].Object != seed[0].Object {
		t.Fatalf("got %s wm=%d err=%v", eventSummary(evs), wm, err)
	}
}

// Stop from another goroutine while Follow waits: Stop closes w.done
// without marking the watcher terminated, so Follow's select wakes on the
// closed done channel, finds nothing, and loops — a busy loop that only a
// closed stop channel can end. Today's callers (shardserver.watch,
// front's watch) Stop in the goroutine that calls Follow/Next, after it
// returned, so they do not hit it.
func TestFollowReturnsAfterConcurrentStop(t *testing.T) {
	f := newFixture(t, Options{})
	w, _ := f.hub.Watch(Request{})
	stop := make(chan struct{})
	c := followAsync(w, stop, nil)
	assertBlocked(t, c)
	w.Stop()
	select {
	case r := <-c:
		if len(r.evs) != 0 || r.wm != 0 {
			t.Fatalf("after Stop: %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
		}
	case <-time.After(2 * time.Second):
		close(stop) // end the spinning goroutine
		<-c
		t.Fatal("Follow did not return after a concurrent Stop")
	}
	close(stop)
}

func TestFollowTerminatedWhenBehind(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, Options{BufferSize: 3, Metrics: m, Resource: "configmaps"})
	terminated := make(chan struct{})
	slow, _ := f.hub.Watch(Request{OnTerminate: func() { close(terminated) }})
	f.apply(store.Added, "ns", "o0", nil) // 101
	edge, _ := f.hub.Watch(Request{})     // will be exactly BufferSize behind
	fast, _ := f.hub.Watch(Request{})
	defer fast.Stop()
	defer edge.Stop()
	for i := 1; i <= 3; i++ {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 102..104
		if evs, _ := followNow(t, fast); len(evs) != 1 {
			t.Fatalf("fast follower got %d events", len(evs))
		}
	}
	// slow is 4 behind with a buffer of 3: terminated by the publish.
	select {
	case <-terminated:
	case <-time.After(10 * time.Second):
		t.Fatal("OnTerminate not called")
	}
	if _, _, err := slow.Follow(closed(), nil); err != ErrTerminated {
		t.Fatalf("slow follower: %v", err)
	}
	// A blocked Follow of a terminated watcher does not block.
	if _, _, err := slow.Follow(make(chan struct{}), nil); err != ErrTerminated {
		t.Fatalf("slow follower, second call: %v", err)
	}
	// edge is exactly BufferSize behind: still served.
	evs, wm := followNow(t, edge)
	if eventSummary(evs) != "ADDED o1@102, ADDED o2@103, ADDED o3@104" || wm != 104 {
		t.Fatalf("edge follower: %s wm=%d", eventSummary(evs), wm)
	}
	if f.hub.Active() != 2 {
		t.Fatalf("active %d, want 2", f.hub.Active())
	}
	if got := testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("configmaps", "slow")); got != 1 {
		t.Fatalf("terminated{slow} = %v", got)
	}
}

func TestResetClosesEveryWatcher(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, Options{Metrics: m, Resource: "configmaps"})
	f.apply(store.Added, "ns", "a", nil) // 101
	f.apply(store.Added, "ns", "b", nil) // 102

	stop := make(chan struct{})
	defer close(stop)
	follower, _ := f.hub.Watch(Request{})
	blocked := followAsync(follower, stop, nil)
	nexter, _ := f.hub.Watch(Request{From: 100})
	terminated := make(chan struct{})
	idle, _ := f.hub.Watch(Request{From: 101, OnTerminate: func() { close(terminated) }})
	listing, _ := f.hub.Watch(Request{InitialEvents: true})
	assertBlocked(t, blocked)
	if f.hub.Active() != 4 {
		t.Fatalf("active %d", f.hub.Active())
	}

	f.hub.Reset(200, "shard_restart")

	if r := waitResult(t, blocked); r.err != ErrTerminated {
		t.Fatalf("blocked follower: %s wm=%d err=%v", eventSummary(r.evs), r.wm, r.err)
	}
	if _, err := nexter.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("Next: %v", err)
	}
	if _, _, err := idle.Follow(closed(), nil); err != ErrTerminated {
		t.Fatalf("Follow: %v", err)
	}
	select {
	case <-terminated:
	case <-time.After(10 * time.Second):
		t.Fatal("OnTerminate not called")
	}
	if err := listing.Initial(func(*store.Object) bool { return true }); err != ErrTerminated {
		t.Fatalf("Initial after reset: %v", err)
	}
	if f.hub.Active() != 0 {
		t.Fatalf("active %d after reset", f.hub.Active())
	}
	if got := testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("configmaps", "shard_restart")); got != 4 {
		t.Fatalf("terminated{shard_restart} = %v, want 4", got)
	}
	if got := testutil.ToFloat64(m.WatchersActive.WithLabelValues("configmaps")); got != 0 {
		t.Fatalf("watchers gauge = %v", got)
	}
	if f.hub.LastRV() != 200 {
		t.Fatalf("LastRV %d, want 200", f.hub.LastRV())
	}
	// Stopping a terminated watcher is harmless (no double count).
	follower.Stop()
	if f.hub.Active() != 0 || testutil.ToFloat64(m.WatchersActive.WithLabelValues("configmaps")) != 0 {
		t.Fatal("Stop after Reset changed the counts")
	}
	// A reset with no watchers counts nothing.
	f.hub.Reset(210, "shard_restart")
	if got := testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("configmaps", "shard_restart")); got != 4 {
		t.Fatalf("terminated{shard_restart} = %v after an empty reset", got)
	}
}

func TestResetExpiresOlderRVs(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 5 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 101..105
	}
	// Before the reset, 101 is in the history.
	w, err := f.hub.Watch(Request{From: 101})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()

	f.hub.Reset(200, "test")
	for _, from := range []uint64{100, 101, 105, 199} {
		if _, err := f.hub.Watch(Request{From: from}); !apierrors.IsResourceExpired(err) {
			t.Fatalf("watch from %d after reset to 200: want 410, got %v", from, err)
		}
	}
	// From the reset RV: only what comes after, none of the old history.
	w, err = f.hub.Watch(Request{From: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	now, _ := f.hub.Watch(Request{})
	defer now.Stop()
	if now.SnapshotRV != 200 {
		t.Fatalf("watch from now starts at %d", now.SnapshotRV)
	}
	if evs, wm := followNow(t, w); len(evs) != 0 || wm != 0 {
		t.Fatalf("after reset: %s wm=%d", eventSummary(evs), wm)
	}
	f.rv = 200
	f.apply(store.Added, "ns", "new", nil) // 201
	for _, w := range []*Watcher{w, now} {
		evs, wm := followNow(t, w)
		if eventSummary(evs) != "ADDED new@201" || wm != 201 {
			t.Fatalf("after reset: %s wm=%d", eventSummary(evs), wm)
		}
	}
	// A later watcher from a future RV is still accepted.
	if w, err := f.hub.Watch(Request{From: 300}); err != nil {
		t.Fatal(err)
	} else {
		w.Stop()
	}
}

func TestResetNeverMovesBack(t *testing.T) {
	f := newFixture(t, Options{})
	f.hub.Progress(150)
	w, _ := f.hub.Watch(Request{})
	if _, wm := followNow(t, w); wm != 0 {
		t.Fatalf("watermark %d", wm)
	}

	f.hub.Reset(120, "test")
	if f.hub.LastRV() != 150 {
		t.Fatalf("LastRV %d after Reset(120) at 150", f.hub.LastRV())
	}
	// The floor is the hub's RV, not the lower reset RV.
	if _, err := f.hub.Watch(Request{From: 130}); !apierrors.IsResourceExpired(err) {
		t.Fatalf("watch from 130: want 410, got %v", err)
	}
	w2, err := f.hub.Watch(Request{From: 150})
	if err != nil {
		t.Fatalf("watch from 150: %v", err)
	}
	defer w2.Stop()
	// The old watcher was closed anyway.
	if _, _, err := w.Follow(closed(), nil); err != ErrTerminated {
		t.Fatalf("old watcher: %v", err)
	}
	// Same RV: same.
	f.hub.Reset(150, "test")
	if f.hub.LastRV() != 150 {
		t.Fatalf("LastRV %d", f.hub.LastRV())
	}
	if _, _, err := w2.Follow(closed(), nil); err != ErrTerminated {
		t.Fatalf("watcher before the second reset: %v", err)
	}
	// Forward moves it and wakes a waiter for WaitFor.
	done := make(chan error, 1)
	go func() { done <- f.hub.WaitFor(t.Context(), 170) }()
	f.hub.Reset(170, "test")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitFor not woken by Reset")
	}
	if f.hub.LastRV() != 170 {
		t.Fatalf("LastRV %d", f.hub.LastRV())
	}
	// Progress below is ignored afterwards too.
	f.hub.Progress(160)
	if f.hub.LastRV() != 170 {
		t.Fatalf("LastRV %d after Progress(160)", f.hub.LastRV())
	}
}

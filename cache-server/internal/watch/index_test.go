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

const nodeName = "spec.nodeName"

// nodeOptions index spec.nodeName, as a pods hub does.
func nodeOptions(o Options) Options {
	o.FieldIndexes = []string{nodeName}
	return o
}

// pod is a stored pod on node ("" = not bound) with labels.
func pod(ns, name string, rv uint64, node string, labels map[string]string) *store.Object {
	o := obj(ns, name, rv, labels)
	o.Fields = map[string]string{nodeName: node}
	return o
}

// applyPod writes one pod change the way the ingester does.
func (f *fixture) applyPod(typ store.EventType, ns, name, node string, labels map[string]string) uint64 {
	f.t.Helper()
	f.rv++
	ev := store.Event{Type: typ, Object: pod(ns, name, f.rv, node, labels), RV: f.rv}
	if err := f.st.Apply(ev); err != nil {
		f.t.Fatal(err)
	}
	f.hub.Publish([]store.Event{ev})
	return f.rv
}

// onNode is a kubelet's watch: spec.nodeName=node, indexed.
func onNode(node string, from uint64) Request {
	return Request{
		Match: func(o *store.Object) bool { return o.Fields[nodeName] == node },
		Index: store.IndexValue{Field: nodeName, Value: node}, From: from,
	}
}

func mustWatch(t *testing.T, h *Hub, req Request) *Watcher {
	t.Helper()
	w, err := h.Watch(req)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestIndexedTransitions: an indexed watcher sees pods arrive on and leave
// its node (binding, moving, unbinding, deletion) as ADDED and DELETED,
// and nothing of other nodes.
func TestIndexedTransitions(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{}))
	w := mustWatch(t, f.hub, onNode("n1", f.rv))
	f.applyPod(store.Added, "a", "p", "", nil)      // 101 pending: not visible
	f.applyPod(store.Modified, "a", "p", "n1", nil) // 102 bound: ADDED
	f.applyPod(store.Modified, "a", "p", "n1", nil) // 103 MODIFIED
	f.applyPod(store.Modified, "a", "p", "n2", nil) // 104 moved away: DELETED
	f.applyPod(store.Added, "a", "q", "n2", nil)    // 105 other node
	f.applyPod(store.Modified, "a", "q", "n1", nil) // 106 moved here: ADDED
	f.applyPod(store.Modified, "a", "q", "", nil)   // 107 unbound: DELETED
	f.applyPod(store.Modified, "a", "q", "n1", nil) // 108 ADDED
	f.applyPod(store.Deleted, "a", "q", "n1", nil)  // 109 DELETED
	f.applyPod(store.Added, "a", "r", "n1", nil)    // 110 ADDED
	f.applyPod(store.Modified, "a", "r", "n3", nil) // 111 DELETED
	f.applyPod(store.Deleted, "a", "r", "n3", nil)  // 112 not visible
	got := summary(drain(t, w))
	want := "ADDED p@102, MODIFIED p@103, DELETED p@104, ADDED q@106, DELETED q@107, ADDED q@108, DELETED q@109, ADDED r@110, DELETED r@111"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// The DELETED of a pod that moved away is its last state on the
	// node, with the event's RV.
	out := drainFrom(t, f.hub, onNode("n1", 103))
	if out[0].Type != "DELETED" || out[0].Object.Fields[nodeName] != "n1" || !out[0].RewriteRV || out[0].RV != 104 {
		t.Fatalf("moved-away DELETED: %+v", out[0])
	}
	// Unbound pods are the value "" (the scheduler's spec.nodeName=).
	if got := summary(drainFrom(t, f.hub, onNode("", 100))); got != "ADDED p@101, DELETED p@102, ADDED q@107, DELETED q@108" {
		t.Fatal(got)
	}
}

func drainFrom(t *testing.T, h *Hub, req Request) []Out {
	t.Helper()
	w := mustWatch(t, h, req)
	defer w.Stop()
	return drain(t, w)
}

// TestIndexedLagCountsOwnEvents: a storm on other nodes terminates the
// unindexed watcher that does not read, never an indexed one; an indexed
// watcher that falls behind on its own node's events is terminated and
// counted.
func TestIndexedLagCountsOwnEvents(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, nodeOptions(Options{BufferSize: 5, Metrics: m, Resource: "pods"}))
	idle := mustWatch(t, f.hub, onNode("a", f.rv))
	reader := mustWatch(t, f.hub, onNode("a", f.rv))
	unindexed := mustWatch(t, f.hub, Request{Match: func(o *store.Object) bool { return o.Fields[nodeName] == "a" }, From: f.rv})
	for i := range 50 {
		f.applyPod(store.Added, "ns", fmt.Sprint("b", i), "b", nil)
	}
	if _, err := unindexed.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("unindexed watcher 50 events behind: %v", err)
	}
	if out := drain(t, idle); len(out) != 0 {
		t.Fatalf("indexed watcher got other nodes' events: %s", summary(out))
	}
	slow := func() float64 { return testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("pods", "slow")) }
	if slow() != 1 {
		t.Fatalf("terminated %v, want 1", slow())
	}
	// Its own events: 5 are within the buffer, the 6th is one too many
	// for the watcher that does not read.
	for i := range 6 {
		f.applyPod(store.Added, "ns", fmt.Sprint("a", i), "a", nil)
		if len(drain(t, reader)) != 1 {
			t.Fatal("reader missed an event")
		}
		if i < 5 && idle.terminated.Load() {
			t.Fatalf("terminated %d events behind", i+1)
		}
	}
	if _, err := idle.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("indexed watcher 6 own events behind: %v", err)
	}
	if slow() != 2 || f.hub.Active() != 1 {
		t.Fatalf("terminated %v, active %d", slow(), f.hub.Active())
	}
}

// TestIndexedNotWokenByOtherValues counts wake-ups: a watcher blocked in
// Next wakes for its node's events (also a pod moving in or out), not for
// other nodes'.
func TestIndexedNotWokenByOtherValues(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{}))
	w := mustWatch(t, f.hub, onNode("a", f.rv))
	f.applyPod(store.Added, "ns", "moving", "b", nil)
	got := nextAsync(t, f.hub, w)
	for i := range 1000 {
		f.applyPod(store.Added, "ns", fmt.Sprint("b", i), "b", nil)
	}
	f.hub.Progress(f.rv + 10)
	f.rv += 10
	if n := w.wakeups.Load(); n != 0 {
		t.Fatalf("woken %d times by other nodes' events", n)
	}
	f.applyPod(store.Modified, "ns", "moving", "a", nil) // moves in
	if s := summary(await(t, got)); s != fmt.Sprintf("ADDED moving@%d", f.rv) {
		t.Fatal(s)
	}
	got = nextAsync(t, f.hub, w)
	f.applyPod(store.Modified, "ns", "moving", "c", nil) // moves out
	if s := summary(await(t, got)); s != fmt.Sprintf("DELETED moving@%d", f.rv) {
		t.Fatal(s)
	}
	if n := w.wakeups.Load(); n != 2 {
		t.Fatalf("woken %d times, want 2", n)
	}
}

// nextAsync runs Next in a goroutine and returns once it waits for a
// change.
func nextAsync(t *testing.T, h *Hub, w *Watcher) <-chan []Out {
	t.Helper()
	got := make(chan []Out, 1)
	go func() {
		out, err := w.Next(nil, nil)
		if err != nil {
			t.Error(err)
		}
		got <- out
	}()
	waitBlocked(t, h, w)
	return got
}

// await is what a blocked Next returned; it fails after 10 seconds (a
// watcher that was not woken).
func await(t *testing.T, got <-chan []Out) []Out {
	t.Helper()
	select {
	case out := <-got:
		return out
	case <-time.After(10 * time.Second):
		t.Fatal("Next was not woken")
		return nil
	}
}

// waitBlocked waits until w waits for a change.
func waitBlocked(t *testing.T, h *Hub, w *Watcher) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.RLock()
		var ch *chan struct{}
		if w.post != nil {
			ch = w.post.wake.ch.Load()
		} else {
			ch = h.notify.ch.Load()
		}
		h.mu.RUnlock()
		if ch != nil {
			time.Sleep(time.Millisecond) // from taking the channel to waiting on it
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("watcher never waited")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestIndexedPruning: postings are pruned with the history; an indexed
// watcher whose unread events were pruned is terminated, one with nothing
// unread is not, and resuming from before the history is 410.
func TestIndexedPruning(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{MaxHistory: 10}))
	behind := mustWatch(t, f.hub, onNode("a", f.rv))
	quiet := mustWatch(t, f.hub, onNode("c", f.rv))
	caughtUp := mustWatch(t, f.hub, onNode("a", f.rv))
	start := f.rv
	for i := range 3 {
		f.applyPod(store.Added, "ns", fmt.Sprint("a", i), "a", nil)
	}
	if len(drain(t, caughtUp)) != 3 {
		t.Fatal("caught-up watcher")
	}
	for i := range 20 {
		f.applyPod(store.Added, "ns", fmt.Sprint("b", i), "b", nil)
	}
	if _, err := behind.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("watcher whose events were pruned: %v", err)
	}
	for _, w := range []*Watcher{quiet, caughtUp} {
		if out := drain(t, w); len(out) != 0 {
			t.Fatal(summary(out))
		}
	}
	if _, err := f.hub.Watch(onNode("a", start)); !apierrors.IsResourceExpired(err) {
		t.Fatalf("resume from before the history: %v", err)
	}
	// Postings hold only what the history holds: value "a" has no
	// entries left (its posting lives on for its watcher), "b" at most
	// the history's 10.
	f.hub.mu.RLock()
	values := f.hub.idx.fields[0].values
	if p := values["a"]; p == nil || len(p.seqs) != 0 || len(p.watchers) != 1 {
		t.Errorf("posting a: %+v", p)
	}
	if p := values["b"]; p == nil || len(p.seqs) != 10 || p.seqs[0] != f.hub.hist.base {
		t.Errorf("posting b: %+v (history base %d)", p, f.hub.hist.base)
	}
	f.hub.mu.RUnlock()
	caughtUp.Stop()
	quiet.Stop()
	f.hub.mu.RLock()
	if _, ok := values["a"]; ok {
		t.Error("posting a outlived its entries and watchers")
	}
	if _, ok := values["c"]; ok {
		t.Error("posting c outlived its watcher")
	}
	f.hub.mu.RUnlock()
	// A resume within the history reads the remaining postings.
	w := mustWatch(t, f.hub, onNode("b", f.rv-2))
	if got := summary(drain(t, w)); got != fmt.Sprintf("ADDED b18@%d, ADDED b19@%d", f.rv-1, f.rv) {
		t.Fatal(got)
	}
}

// TestIndexedResetAndClose: indexed watchers end on Reset (counted with
// its reason) and Close like the others; the index starts again after a
// Reset.
func TestIndexedResetAndClose(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, nodeOptions(Options{Metrics: m, Resource: "pods"}))
	w := mustWatch(t, f.hub, onNode("a", f.rv))
	before := f.applyPod(store.Added, "ns", "p", "a", nil)
	f.hub.Reset(200, "shard_restart")
	if _, err := w.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("after Reset: %v", err)
	}
	if v := testutil.ToFloat64(m.WatchersTerminated.WithLabelValues("pods", "shard_restart")); v != 1 {
		t.Fatalf("terminated{shard_restart} = %v", v)
	}
	if _, err := f.hub.Watch(onNode("a", before)); !apierrors.IsResourceExpired(err) {
		t.Fatalf("resume from before the Reset: %v", err)
	}
	w = mustWatch(t, f.hub, onNode("a", 200))
	f.rv = 200
	f.applyPod(store.Modified, "ns", "p", "a", nil)
	if got := summary(drain(t, w)); got != "MODIFIED p@201" {
		t.Fatal(got)
	}
	f.hub.Close()
	if _, err := w.Next(closed(), nil); err != ErrTerminated {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := f.hub.Watch(onNode("a", 0)); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("Watch after Close: %v", err)
	}
	if v := testutil.ToFloat64(m.WatchDispatchWatchers.WithLabelValues("pods", "indexed")); v != 0 {
		t.Fatalf("indexed watchers gauge %v after Close", v)
	}
}

// TestIndexedRelistBookmark: an indexed watcher whose node the relist's
// difference did not touch still gets the relist's bookmark.
func TestIndexedRelistBookmark(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{}))
	f.applyPod(store.Added, "ns", "x", "b", nil) // 101
	req := onNode("a", f.rv)
	req.AllowBookmarks = true
	w := mustWatch(t, f.hub, req)
	got := nextAsync(t, f.hub, w)
	evs, err := f.st.Replace([]*store.Object{pod("ns", "x", 150, "c", nil)}, 200)
	if err != nil {
		t.Fatal(err)
	}
	f.hub.Relist(evs, 200)
	if got := summary(await(t, got)); got != "BOOKMARK @200" {
		t.Fatal(got)
	}
	if _, err := f.hub.Watch(onNode("a", 150)); !apierrors.IsResourceExpired(err) {
		t.Fatalf("resume inside the relist's gap: %v", err)
	}
}

// TestIndexOnUnindexedField: an Index on a field the hub does not index
// makes an ordinary watcher.
func TestIndexOnUnindexedField(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{}))
	w := mustWatch(t, f.hub, Request{
		Match: func(o *store.Object) bool { return o.Labels["app"] == "x" },
		Index: store.IndexValue{Field: "metadata.labels", Value: "x"}, From: f.rv,
	})
	if w.post != nil {
		t.Fatal("indexed on a field the hub does not index")
	}
	f.applyPod(store.Added, "ns", "p", "a", map[string]string{"app": "x"})
	if got := summary(drain(t, w)); got != "ADDED p@101" {
		t.Fatal(got)
	}
}

// scanRecorder is a Snapshots that records the Scan requests.
type scanRecorder struct {
	Snapshots
	reqs []store.ListRequest
}

func (s *scanRecorder) Scan(req store.ListRequest, fn func(*store.Object) bool) (uint64, error) {
	s.reqs = append(s.reqs, req)
	return s.Snapshots.Scan(req, fn)
}

// TestIndexedWatchList: a watch-list's initial events are scanned with the
// watcher's Index, and its live events join them without a gap.
func TestIndexedWatchList(t *testing.T) {
	f := newFixture(t, nodeOptions(Options{}))
	rec := &scanRecorder{Snapshots: f.st}
	f.hub.opts.Store = rec
	f.applyPod(store.Added, "ns", "p", "a", nil)
	f.applyPod(store.Added, "ns", "q", "b", nil)
	req := onNode("a", 0)
	req.InitialEvents = true
	w := mustWatch(t, f.hub, req)
	f.applyPod(store.Modified, "ns", "q", "a", nil) // 103: after the snapshot
	var initial []string
	if err := w.Initial(func(o *store.Object) bool { initial = append(initial, o.Name); return true }); err != nil {
		t.Fatal(err)
	}
	w.InitialDone()
	if len(initial) != 1 || initial[0] != "p" {
		t.Fatalf("initial %v", initial)
	}
	if len(rec.reqs) != 1 || rec.reqs[0].Index != req.Index || rec.reqs[0].SnapshotRV != 102 {
		t.Fatalf("scan requests %+v", rec.reqs)
	}
	if got := summary(drain(t, w)); got != "ADDED q@103" {
		t.Fatal(got)
	}
}

// TestDispatchMetrics: watchers by dispatch, values watched, and how many
// watchers each event was offered to.
func TestDispatchMetrics(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	f := newFixture(t, nodeOptions(Options{Metrics: m, Resource: "pods"}))
	ws := []*Watcher{
		mustWatch(t, f.hub, onNode("a", 0)),
		mustWatch(t, f.hub, onNode("a", 0)),
		mustWatch(t, f.hub, onNode("b", 0)),
		mustWatch(t, f.hub, Request{}),
	}
	gauge := func(g prometheus.Gauge) float64 { return testutil.ToFloat64(g) }
	if i, u, v := gauge(m.WatchDispatchWatchers.WithLabelValues("pods", "indexed")), gauge(m.WatchDispatchWatchers.WithLabelValues("pods", "unindexed")), gauge(m.WatchIndexValues.WithLabelValues("pods")); i != 3 || u != 1 || v != 2 {
		t.Fatalf("indexed %v unindexed %v values %v", i, u, v)
	}
	f.applyPod(store.Added, "ns", "p", "a", nil)    // a's 2 + 1 unindexed
	f.applyPod(store.Modified, "ns", "p", "b", nil) // a's 2 + b's 1 + 1
	f.applyPod(store.Added, "ns", "q", "z", nil)    // 1
	want := `
# HELP cachetier_watch_dispatch_candidates Watchers each published event was offered to: the indexed watchers of its old and new values plus every unindexed watcher (the work of dispatching it).
# TYPE cachetier_watch_dispatch_candidates histogram
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="0"} 0
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="1"} 1
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="2"} 1
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="5"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="10"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="25"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="50"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="100"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="250"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="500"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="1000"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="2500"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="5000"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="10000"} 3
cachetier_watch_dispatch_candidates_bucket{resource="pods",le="+Inf"} 3
cachetier_watch_dispatch_candidates_sum{resource="pods"} 8
cachetier_watch_dispatch_candidates_count{resource="pods"} 3
`
	if err := testutil.CollectAndCompare(m.WatchDispatchCandidates, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		w.Stop()
	}
	if i, u, v := gauge(m.WatchDispatchWatchers.WithLabelValues("pods", "indexed")), gauge(m.WatchDispatchWatchers.WithLabelValues("pods", "unindexed")), gauge(m.WatchIndexValues.WithLabelValues("pods")); i != 0 || u != 0 || v != 0 {
		t.Fatalf("after Stop: indexed %v unindexed %v values %v", i, u, v)
	}
}

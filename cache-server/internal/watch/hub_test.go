package watch

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

type fixture struct {
	t   *testing.T
	st  *store.Store
	hub *Hub
	rv  uint64
	clk *clocktesting.FakeClock
}

func newFixture(t *testing.T, opts Options) *fixture {
	st, err := store.New(store.Options{Shards: 4, HistoryWindow: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	opts.Store, opts.Clock = st, clk
	f := &fixture{t: t, st: st, hub: New(opts), rv: 100, clk: clk}
	evs, err := st.Replace(nil, f.rv)
	if err != nil {
		t.Fatal(err)
	}
	f.hub.Relist(evs, f.rv)
	return f
}

func obj(ns, name string, rv uint64, labels map[string]string) *store.Object {
	return &store.Object{
		Key: keyhash.Key(ns, name), Namespace: ns, Name: name, RV: rv, Labels: labels,
		Raw: fmt.Appendf(nil, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"resourceVersion":"%d"}}`, name, ns, rv),
	}
}

// apply writes one change the way the ingester does: store first, then hub.
func (f *fixture) apply(typ store.EventType, ns, name string, labels map[string]string) {
	f.t.Helper()
	f.rv++
	ev := store.Event{Type: typ, Object: obj(ns, name, f.rv, labels), RV: f.rv}
	if err := f.st.Apply(ev); err != nil {
		f.t.Fatal(err)
	}
	f.hub.Publish([]store.Event{ev})
}

func drain(t *testing.T, w *Watcher) []Out {
	t.Helper()
	stop := make(chan struct{})
	close(stop)
	out, err := w.Next(stop, nil)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return out
}

func summary(out []Out) string {
	var parts []string
	for _, o := range out {
		name := ""
		if o.Object != nil {
			name = o.Object.Name
		}
		parts = append(parts, fmt.Sprintf("%s %s@%d", o.Type, name, o.RV))
	}
	return strings.Join(parts, ", ")
}

func TestSelectorTransitions(t *testing.T) {
	f := newFixture(t, Options{})
	match := func(o *store.Object) bool { return o.Labels["app"] == "x" }
	w, err := f.hub.Watch(Request{Match: match, From: f.rv})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.apply(store.Added, "a", "one", map[string]string{"app": "y"})    // 101 not visible
	f.apply(store.Modified, "a", "one", map[string]string{"app": "x"}) // 102 ADDED
	f.apply(store.Modified, "a", "one", map[string]string{"app": "x"}) // 103 MODIFIED
	f.apply(store.Modified, "a", "one", map[string]string{"app": "z"}) // 104 DELETED (last state, RV 104)
	f.apply(store.Added, "a", "two", map[string]string{"app": "x"})    // 105 ADDED
	f.apply(store.Deleted, "a", "two", map[string]string{"app": "x"})  // 106 DELETED
	got := summary(drain(t, w))
	want := "ADDED one@102, MODIFIED one@103, DELETED one@104, ADDED two@105, DELETED two@106"
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	// The DELETED from a transition is the previous state with the event's RV.
	f2 := newFixture(t, Options{})
	w2, _ := f2.hub.Watch(Request{Match: match, From: f2.rv})
	f2.apply(store.Added, "a", "one", map[string]string{"app": "x"})
	f2.apply(store.Modified, "a", "one", map[string]string{"app": "z"})
	out := drain(t, w2)
	if len(out) != 2 || !out[1].RewriteRV || out[1].Object.RV != 101 || out[1].RV != 102 {
		t.Fatalf("transition DELETED: %+v", out)
	}
	raw, err := WithResourceVersion(out[1].Object.Raw, out[1].RV)
	if err != nil || !strings.Contains(string(raw), `"resourceVersion":"102"`) || !strings.Contains(string(raw), `"name":"one"`) {
		t.Fatalf("rewritten: %s %v", raw, err)
	}
}

func TestResumeAndExpired(t *testing.T) {
	f := newFixture(t, Options{MaxHistory: 3})
	for i := range 5 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 101..105
	}
	// History holds 103..105: resuming from 102 works, from 101 is 410.
	w, err := f.hub.Watch(Request{From: 102})
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(drain(t, w)); got != "ADDED o2@103, ADDED o3@104, ADDED o4@105" {
		t.Fatal(got)
	}
	w.Stop()
	_, err = f.hub.Watch(Request{From: 101})
	if !apierrors.IsResourceExpired(err) || err.Error() != "too old resource version: 101 (102)" {
		t.Fatalf("want 410 too old, got %v", err)
	}
	// Namespace scoping.
	w, _ = f.hub.Watch(Request{From: 105, Namespace: "other"})
	f.apply(store.Added, "ns", "x", nil)
	f.apply(store.Added, "other", "y", nil)
	if got := summary(drain(t, w)); got != "ADDED y@107" {
		t.Fatal(got)
	}
}

func TestFutureRV(t *testing.T) {
	f := newFixture(t, Options{})
	w, err := f.hub.Watch(Request{From: 102})
	if err != nil {
		t.Fatal(err)
	}
	f.apply(store.Added, "ns", "a", nil) // 101: not after 102
	f.apply(store.Added, "ns", "b", nil) // 102
	f.apply(store.Added, "ns", "c", nil) // 103
	if got := summary(drain(t, w)); got != "ADDED c@103" {
		t.Fatal(got)
	}
}

func TestSlowWatcherTerminated(t *testing.T) {
	f := newFixture(t, Options{BufferSize: 5})
	slow, _ := f.hub.Watch(Request{From: f.rv})
	fast, _ := f.hub.Watch(Request{From: f.rv})
	terminated := make(chan struct{})
	slow.onTerminate = func() { close(terminated) }
	for i := range 20 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil)
		if len(drain(t, fast)) != 1 {
			t.Fatal("fast watcher missed an event")
		}
	}
	<-terminated
	if _, err := slow.Next(nil, nil); err != ErrTerminated {
		t.Fatalf("slow watcher: %v", err)
	}
	if f.hub.Active() != 1 {
		t.Fatalf("active = %d", f.hub.Active())
	}
	fast.Stop()
	if f.hub.Active() != 0 {
		t.Fatalf("active = %d", f.hub.Active())
	}
}

func TestWatchListNoGapNoDuplicate(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 10 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil) // 101..110
	}
	w, _ := f.hub.Watch(Request{InitialEvents: true})
	if w.SnapshotRV != 110 {
		t.Fatal(w.SnapshotRV)
	}
	// Changes while the initial state is being streamed.
	f.apply(store.Modified, "ns", "o0", nil) // 111
	f.apply(store.Deleted, "ns", "o1", nil)  // 112
	f.apply(store.Added, "ns", "late", nil)  // 113
	seen := map[string]uint64{}
	if err := w.Initial(func(o *store.Object) bool { seen[o.Name] = o.RV; return true }); err != nil {
		t.Fatal(err)
	}
	w.InitialDone()
	if len(seen) != 10 || seen["o0"] != 101 || seen["late"] != 0 {
		t.Fatalf("initial state: %v", seen)
	}
	if got := summary(drain(t, w)); got != "MODIFIED o0@111, DELETED o1@112, ADDED late@113" {
		t.Fatal(got)
	}
}

func TestWatchListSlowClientDoesNotBlockOthers(t *testing.T) {
	f := newFixture(t, Options{BufferSize: 2})
	for i := range 5 {
		f.apply(store.Added, "ns", fmt.Sprint("o", i), nil)
	}
	list, _ := f.hub.Watch(Request{InitialEvents: true})
	live, _ := f.hub.Watch(Request{From: f.rv})
	n := 0
	_ = list.Initial(func(*store.Object) bool {
		// A live change for every initial object: the live watcher gets
		// them at once; the watch-list's lag is not counted yet.
		f.apply(store.Added, "ns", fmt.Sprint("live", n), nil)
		n++
		if len(drain(t, live)) != 1 {
			t.Fatal("live watcher blocked")
		}
		return true
	})
	list.InitialDone() // now 5 behind with a buffer of 2: terminated
	if _, err := list.Next(nil, nil); err != ErrTerminated {
		t.Fatalf("want terminated after initial events, got %v", err)
	}
}

func TestBookmarks(t *testing.T) {
	f := newFixture(t, Options{BookmarkFrequency: time.Minute})
	match := func(o *store.Object) bool { return o.Labels["app"] == "x" }
	w, _ := f.hub.Watch(Request{Match: match, From: f.rv, AllowBookmarks: true})
	f.apply(store.Added, "ns", "invisible", nil) // 101, filtered out
	f.hub.Progress(150)
	if out := drain(t, w); len(out) != 0 {
		t.Fatalf("bookmark before its time: %s", summary(out))
	}
	f.clk.Step(time.Minute)
	if got := summary(drain(t, w)); got != "BOOKMARK @150" {
		t.Fatal(got)
	}
	// No new RV: no bookmark.
	f.clk.Step(time.Minute)
	if out := drain(t, w); len(out) != 0 {
		t.Fatal(summary(out))
	}
	// Pre-timeout bookmark: 2s before the deadline.
	w2, _ := f.hub.Watch(Request{From: 150, AllowBookmarks: true, Deadline: f.clk.Now().Add(5 * time.Second)})
	f.hub.Progress(160)
	f.clk.Step(3 * time.Second)
	if got := summary(drain(t, w2)); got != "BOOKMARK @160" {
		t.Fatal(got)
	}
	// Next blocks and wakes up for the bookmark timer.
	f.hub.Progress(170)
	done := make(chan []Out)
	go func() {
		out, _ := w.Next(nil, nil)
		done <- out
	}()
	for !f.clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	f.clk.Step(time.Minute)
	if got := summary(<-done); got != "BOOKMARK @170" {
		t.Fatal(got)
	}
}

func TestRelistDiffAndGap(t *testing.T) {
	f := newFixture(t, Options{})
	f.apply(store.Added, "ns", "keep", nil)   // 101
	f.apply(store.Added, "ns", "change", nil) // 102
	f.apply(store.Added, "ns", "gone", nil)   // 103
	w, _ := f.hub.Watch(Request{From: 103, AllowBookmarks: true})
	// Upstream 410 → relist at 200: "change" changed, "gone" was deleted,
	// "new" appeared.
	objs := []*store.Object{obj("ns", "keep", 101, nil), obj("ns", "change", 150, nil), obj("ns", "new", 160, nil)}
	evs, err := f.st.Replace(objs, 200)
	if err != nil {
		t.Fatal(err)
	}
	f.hub.Relist(evs, 200)
	got := summary(drain(t, w))
	want := "MODIFIED change@200, DELETED gone@200, ADDED new@200, BOOKMARK @200"
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	// Resuming from inside the relist gap cannot be served.
	if _, err := f.hub.Watch(Request{From: 150}); !apierrors.IsResourceExpired(err) {
		t.Fatalf("want 410 inside the gap, got %v", err)
	}
	// From before the gap: the diff is still a correct continuation.
	w2, err := f.hub.Watch(Request{From: 103})
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(drain(t, w2)); got != "MODIFIED change@200, DELETED gone@200, ADDED new@200" {
		t.Fatal(got)
	}
}

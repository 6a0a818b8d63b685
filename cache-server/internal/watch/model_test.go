package watch

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// The "every event, exactly once" test: many selective watchers — indexed
// on 200 nodes and on "" (unbound pods), unindexed with other selectors,
// from exact RVs, from now and watch-lists, started as the run goes — and
// pods that are created, bound, moved, unbound, deleted and re-created,
// with relists in between. Each watcher's events must equal what a plain
// model gives: its selector applied to each event's old and new object in
// RV order; nothing missing, duplicated or out of order, and no bookmark
// ahead of an undelivered event.

// modelEvent is one change as the model knows it.
type modelEvent struct {
	typ      store.EventType
	old, new *store.Object // old nil: absent before; new nil: deleted
	rv       uint64
}

// modelWatcher is a watcher and what the model expects of it.
type modelWatcher struct {
	name  string
	w     *Watcher
	match func(*store.Object) bool // the selector, namespace included
	// from: events after it (an exact RV) or, when start >= 0, the events
	// logged from position start on (a watch from now or a watch-list).
	from  uint64
	start int
	// initial is the watch-list's expected initial state, received its
	// received one.
	initial, received []string
	got               []Out
	// lazy: read rarely, so it is often hundreds of events behind (Next
	// then returns part of them: a bookmark must not pass the rest).
	lazy bool
	mu   sync.Mutex // got, in the concurrent run
}

type scenario struct {
	t        *testing.T
	f        *fixture
	rnd      *rand.Rand
	prev     bool // PrevIncluded: events carry Prev, published in batches
	pods     map[string]*store.Object
	gone     []*store.Object // deleted, may come back
	log      []modelEvent
	watchers []*modelWatcher
	pending  []store.Event // unpublished batch (prev mode)
}

const modelNodes = 200

func modelNode(i int) string { return fmt.Sprintf("node-%03d", i) }

func newScenario(t *testing.T, seed uint64, prev bool) *scenario {
	opts := nodeOptions(Options{BufferSize: 1 << 30, HistoryWindow: time.Hour, BookmarkFrequency: time.Second, PrevIncluded: prev})
	s := &scenario{t: t, f: newFixture(t, opts), rnd: rand.New(rand.NewPCG(seed, 1)), prev: prev, pods: map[string]*store.Object{}}
	return s
}

func (s *scenario) randomNode() string {
	if s.rnd.IntN(5) == 0 {
		return ""
	}
	return modelNode(s.rnd.IntN(modelNodes))
}

func (s *scenario) randomLabels() map[string]string {
	return map[string]string{"app": []string{"x", "y"}[s.rnd.IntN(2)]}
}

func (s *scenario) randomPod(filter func(*store.Object) bool) *store.Object {
	var keys []string
	for k, o := range s.pods {
		if filter == nil || filter(o) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	return s.pods[keys[s.rnd.IntN(len(keys))]]
}

// change applies one event to the store and the model, and publishes it
// (at once, or in the pending batch in prev mode).
func (s *scenario) change(typ store.EventType, ns, name, node string, labels map[string]string) {
	s.f.rv++
	o := pod(ns, name, s.f.rv, node, labels)
	old := s.pods[o.Key]
	ev := store.Event{Type: typ, Object: o, RV: s.f.rv}
	if err := s.f.st.Apply(ev); err != nil {
		s.t.Fatal(err)
	}
	me := modelEvent{typ: typ, old: old, new: o, rv: s.f.rv}
	if typ == store.Deleted {
		me.new = nil
		delete(s.pods, o.Key)
		s.gone = append(s.gone, o)
	} else {
		s.pods[o.Key] = o
	}
	s.log = append(s.log, me)
	if !s.prev {
		s.f.hub.Publish([]store.Event{ev})
		return
	}
	ev.Prev = old
	s.pending = append(s.pending, ev)
	if s.rnd.IntN(3) == 0 {
		s.flush()
	}
}

func (s *scenario) flush() {
	if len(s.pending) > 0 {
		s.f.hub.Publish(s.pending)
		s.pending = nil
	}
}

// step makes one random change.
func (s *scenario) step() {
	switch r := s.rnd.IntN(100); {
	case r < 20 || len(s.pods) < 50: // create
		name := fmt.Sprintf("p%d", s.f.rv)
		s.change(store.Added, fmt.Sprint("ns-", s.rnd.IntN(3)), name, s.randomNode(), s.randomLabels())
	case r < 35: // bind a pending pod
		if o := s.randomPod(func(o *store.Object) bool { return o.Fields[nodeName] == "" }); o != nil {
			s.change(store.Modified, o.Namespace, o.Name, modelNode(s.rnd.IntN(modelNodes)), o.Labels)
		}
	case r < 55: // update in place (labels may change)
		if o := s.randomPod(nil); o != nil {
			s.change(store.Modified, o.Namespace, o.Name, o.Fields[nodeName], s.randomLabels())
		}
	case r < 65: // the node changes in one event (what a hub must handle)
		if o := s.randomPod(nil); o != nil {
			s.change(store.Modified, o.Namespace, o.Name, s.randomNode(), o.Labels)
		}
	case r < 70: // unbound
		if o := s.randomPod(func(o *store.Object) bool { return o.Fields[nodeName] != "" }); o != nil {
			s.change(store.Modified, o.Namespace, o.Name, "", o.Labels)
		}
	case r < 88: // deleted (the event carries the last state)
		if o := s.randomPod(nil); o != nil {
			s.change(store.Deleted, o.Namespace, o.Name, o.Fields[nodeName], o.Labels)
		}
	default: // re-created, maybe elsewhere: a move as kubectl sees it
		if len(s.gone) > 0 {
			i := s.rnd.IntN(len(s.gone))
			o := s.gone[i]
			s.gone = slices.Delete(s.gone, i, i+1)
			if _, exists := s.pods[o.Key]; !exists {
				s.change(store.Added, o.Namespace, o.Name, s.randomNode(), o.Labels)
			}
		}
	}
}

// relist replaces the state at a later RV with a changed one (some pods
// moved, some gone, some new) and publishes the difference.
func (s *scenario) relist() {
	s.flush()
	gapStart := s.f.rv
	s.f.rv += 10
	rv := s.f.rv
	var objs []*store.Object
	for _, k := range slices.Sorted(maps.Keys(s.pods)) {
		o := s.pods[k]
		switch s.rnd.IntN(10) {
		case 0: // gone
		case 1, 2: // changed inside the gap
			objs = append(objs, pod(o.Namespace, o.Name, gapStart+1+s.rnd.Uint64N(9), s.randomNode(), o.Labels))
		default:
			objs = append(objs, o)
		}
	}
	for i := range 5 {
		objs = append(objs, pod("ns-0", fmt.Sprintf("relisted-%d-%d", rv, i), gapStart+1+s.rnd.Uint64N(9), s.randomNode(), s.randomLabels()))
	}
	evs, err := s.f.st.Replace(objs, rv)
	if err != nil {
		s.t.Fatal(err)
	}
	for i, ev := range evs {
		old := s.pods[ev.Object.Key]
		me := modelEvent{typ: ev.Type, old: old, new: ev.Object, rv: rv}
		if ev.Type == store.Deleted {
			me.new = nil
			delete(s.pods, ev.Object.Key)
		} else {
			s.pods[ev.Object.Key] = ev.Object
		}
		s.log = append(s.log, me)
		if s.prev {
			evs[i].Prev = old
		}
	}
	s.f.hub.Relist(evs, rv)
}

// addWatchers starts watchers of every kind.
func (s *scenario) addWatchers(round int) {
	s.flush()
	add := func(name string, req Request) {
		prefix := keyhash.NamespacePrefix(req.Namespace)
		match := req.Match
		mw := &modelWatcher{name: fmt.Sprintf("r%d %s", round, name), start: -1, match: func(o *store.Object) bool {
			return (prefix == "" || strings.HasPrefix(o.Key, prefix)) && (match == nil || match(o))
		}}
		kind := s.rnd.IntN(3)
		if len(s.log) == 0 {
			kind = 1 + s.rnd.IntN(2)
		}
		switch kind {
		case 0: // from an exact RV in the history
			req.From = s.log[s.rnd.IntN(len(s.log))].rv
			mw.from = req.From
		case 1: // from now
			mw.start = len(s.log)
		case 2: // watch-list
			req.InitialEvents = true
			mw.start = len(s.log)
			for _, k := range slices.Sorted(maps.Keys(s.pods)) {
				if o := s.pods[k]; mw.match(o) {
					mw.initial = append(mw.initial, fmt.Sprintf("%s@%d", o.Name, o.RV))
				}
			}
			mw.name += " (watch-list)"
		}
		req.AllowBookmarks = s.rnd.IntN(2) == 0
		mw.lazy = s.rnd.IntN(4) == 0
		mw.w = mustWatch(s.t, s.f.hub, req)
		s.watchers = append(s.watchers, mw)
		if req.InitialEvents {
			// Changes between registering and streaming the snapshot.
			for range s.rnd.IntN(3) {
				s.step()
			}
			s.flush()
			if err := mw.w.Initial(func(o *store.Object) bool {
				mw.received = append(mw.received, fmt.Sprintf("%s@%d", o.Name, o.RV))
				return true
			}); err != nil {
				s.t.Fatal(err)
			}
			mw.w.InitialDone()
		}
	}
	for i := -1; i < modelNodes; i++ {
		node := ""
		if i >= 0 {
			node = modelNode(i)
		}
		for range s.rnd.IntN(3) {
			req := onNode(node, 0)
			name := "node=" + node
			switch s.rnd.IntN(4) {
			case 0: // and a label
				req.Match = func(o *store.Object) bool { return o.Fields[nodeName] == node && o.Labels["app"] == "x" }
				name += ",app=x"
			case 1: // in one namespace
				req.Namespace = "ns-1"
				name += " in ns-1"
			}
			add(name, req)
		}
	}
	add("app=x", Request{Match: func(o *store.Object) bool { return o.Labels["app"] == "x" }})
	add("ns-2", Request{Namespace: "ns-2"})
	add("node!=node-003", Request{Match: func(o *store.Object) bool { return o.Fields[nodeName] != modelNode(3) }})
	add("node in (1,2)", Request{Match: func(o *store.Object) bool {
		n := o.Fields[nodeName]
		return n == modelNode(1) || n == modelNode(2)
	}})
	add("everything", Request{})
	add("index on an unindexed field", Request{
		Match: func(o *store.Object) bool { return o.Labels["app"] == "y" },
		Index: store.IndexValue{Field: "metadata.labels.app", Value: "y"},
	})
}

// read takes what Next has for a watcher now (one call: watchers stop
// part-way through the history).
func (s *scenario) read(mw *modelWatcher) {
	out, err := mw.w.Next(closed(), nil)
	if err != nil {
		s.t.Fatalf("%s: %v", mw.name, err)
	}
	mw.got = append(mw.got, out...)
}

func (s *scenario) readAll(mw *modelWatcher) {
	for {
		n := len(mw.got)
		s.read(mw)
		if len(mw.got) == n {
			return
		}
	}
}

// expected is what the model says the watcher must receive.
func (mw *modelWatcher) expected(log []modelEvent) []string {
	var out []string
	for i, e := range log {
		if (mw.start >= 0 && i < mw.start) || (mw.start < 0 && e.rv <= mw.from) {
			continue
		}
		isNew := e.new != nil && mw.match(e.new)
		wasOld := e.old != nil && mw.match(e.old)
		key := ""
		switch {
		case isNew && !wasOld:
			key = "ADDED " + e.new.Key
		case isNew && wasOld:
			key = "MODIFIED " + e.new.Key
		case wasOld:
			key = "DELETED " + e.old.Key
		default:
			continue
		}
		out = append(out, fmt.Sprintf("%s@%d", key, e.rv))
	}
	return out
}

// check compares a watcher's events with the model and checks its
// bookmarks; it returns how many bookmarks it saw.
func (s *scenario) check(mw *modelWatcher) int {
	s.t.Helper()
	want := mw.expected(s.log)
	var got []string
	bookmarks := 0
	lastRV := uint64(0)
	for _, o := range mw.got {
		if o.RV < lastRV {
			s.t.Errorf("%s: RV %d after %d", mw.name, o.RV, lastRV)
		}
		lastRV = o.RV
		if o.Type == "BOOKMARK" {
			// Every event up to the bookmark was delivered before it.
			due := 0
			for _, e := range want {
				if rvOf(e) <= o.RV {
					due++
				}
			}
			if len(got) < due {
				s.t.Errorf("%s: BOOKMARK @%d after %d events, but %d events up to it are due", mw.name, o.RV, len(got), due)
			}
			bookmarks++
			continue
		}
		got = append(got, fmt.Sprintf("%s %s@%d", o.Type, o.Object.Key, o.RV))
	}
	if !slices.Equal(got, want) {
		s.t.Errorf("%s: %d events, want %d\n%s", mw.name, len(got), len(want), firstDifference(got, want))
	}
	if !slices.Equal(mw.received, mw.initial) {
		s.t.Errorf("%s: initial events %v, want %v", mw.name, mw.received, mw.initial)
	}
	return bookmarks
}

func rvOf(e string) uint64 {
	var rv uint64
	fmt.Sscan(e[strings.LastIndexByte(e, '@')+1:], &rv)
	return rv
}

func firstDifference(got, want []string) string {
	for i := range max(len(got), len(want)) {
		g, w := "(none)", "(none)"
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("first difference at %d: got %s, want %s", i, g, w)
		}
	}
	return ""
}

func TestEveryEventExactlyOnce(t *testing.T) {
	for _, prev := range []bool{false, true} {
		t.Run(fmt.Sprintf("prevIncluded=%v", prev), func(t *testing.T) {
			s := newScenario(t, 20261125, prev)
			for range 300 {
				s.step()
			}
			const steps = 4000
			for i := range steps {
				if i%1000 == 0 {
					s.addWatchers(i / 1000)
				}
				if i%700 == 350 {
					s.relist()
				}
				if i%40 == 0 {
					s.flush()
					s.f.clk.Step(time.Second) // bookmarks fall due
				}
				s.step()
				if s.rnd.IntN(10) == 0 {
					s.flush()
					for _, mw := range s.watchers {
						if (!mw.lazy && s.rnd.IntN(4) == 0) || s.rnd.IntN(50) == 0 {
							s.read(mw)
						}
					}
				}
			}
			s.flush()
			s.f.clk.Step(time.Second)
			bookmarks, indexed := 0, 0
			for _, mw := range s.watchers {
				s.readAll(mw)
				bookmarks += s.check(mw)
				if mw.w.post != nil {
					indexed++
				}
			}
			if bookmarks == 0 || indexed < modelNodes {
				t.Fatalf("%d bookmarks, %d indexed watchers: the test did not test", bookmarks, indexed)
			}
			t.Logf("%d watchers (%d indexed), %d events, %d bookmarks", len(s.watchers), indexed, len(s.log), bookmarks)
		})
	}
}

// TestEveryEventExactlyOnceConcurrently: the same with every watcher read
// by its own goroutine while the changes are published (run with -race).
func TestEveryEventExactlyOnceConcurrently(t *testing.T) {
	s := newScenario(t, 7, false)
	for range 300 {
		s.step()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(mw *modelWatcher) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []Out
			for {
				var err error
				out, err = mw.w.Next(stop, out[:0])
				if err != nil {
					t.Errorf("%s: %v", mw.name, err)
					return
				}
				mw.mu.Lock()
				mw.got = append(mw.got, out...)
				mw.mu.Unlock()
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	for i := range 3000 {
		if i%1000 == 0 {
			n := len(s.watchers)
			s.addWatchers(i / 1000)
			for _, mw := range s.watchers[n:] {
				run(mw)
			}
		}
		if i == 1500 {
			s.relist()
		}
		s.step()
	}
	// Wait until every watcher has what the model expects, then stop.
	deadline := time.Now().Add(30 * time.Second)
	for _, mw := range s.watchers {
		want := len(mw.expected(s.log))
		for {
			mw.mu.Lock()
			n := 0
			for _, o := range mw.got {
				if o.Type != "BOOKMARK" {
					n++
				}
			}
			mw.mu.Unlock()
			if n >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	for _, mw := range s.watchers {
		s.check(mw)
	}
}

package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
)

// The field indexes are tested against an obvious model: every state of
// the store kept as a map, and kube-apiserver's cacher GetList written out
// over the items it reads (apiserverPage). A store with indexes and the
// same store without any (whose reads of an index filter the key range)
// must both answer every request as the model does.

// testIndexes are the fields the test stores index; "spec.other" is a
// field nothing indexes (reads of it filter).
var testIndexes = []string{"spec.nodeName", "status.phase", "metadata.name"}

// apiserverPage is kube-apiserver's cacher GetList (cacher.go) over the
// items it read, in key order — the whole range for a read of a snapshot,
// the objects with the value for a read of its index
// (GetByIndexSnapshot): the first limit items that match, and whether any
// item read follows the last one taken (hasMoreListItems).
func apiserverPage(read []*Object, match func(*Object) bool, limit int64) (page []*Object, hasMore bool) {
	for i, o := range read {
		if match(o) {
			page = append(page, o)
		}
		if limit > 0 && int64(len(page)) >= limit {
			return page, i < len(read)-1
		}
	}
	return page, false
}

// indexWorld is an indexed store, the same store without indexes, and
// the model's state at every RV a write produced.
type indexWorld struct {
	t              testing.TB
	indexed, plain *Store
	rv             uint64
	cur            model
	states         map[uint64]model
	rvs            []uint64
}

func newIndexWorld(t testing.TB, shards int) *indexWorld {
	t.Helper()
	w := &indexWorld{t: t, cur: model{}, states: map[uint64]model{0: {}}, rvs: []uint64{0}}
	var err error
	if w.indexed, err = New(Options{Shards: shards, HistoryWindow: time.Hour, Indexes: testIndexes}); err != nil {
		t.Fatal(err)
	}
	if w.plain, err = New(Options{Shards: shards, HistoryWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return w
}

// indexedObj is an object with the fields the indexes read; node "-" is
// a pod without spec.nodeName in its field set at all.
func indexedObj(ns, name, node, phase, label string, rv uint64) *Object {
	o := obj(ns, name, rv)
	o.Fields = map[string]string{"status.phase": phase}
	if node != "-" {
		o.Fields["spec.nodeName"] = node
	}
	o.Labels = map[string]string{"l": label}
	return o
}

func clone(o *Object) *Object { c := *o; c.Seq = 0; return &c }

func (w *indexWorld) record() {
	snap := make(model, len(w.cur))
	for k, o := range w.cur {
		snap[k] = o
	}
	w.states[w.rv] = snap
	w.rvs = append(w.rvs, w.rv)
}

func (w *indexWorld) apply(typ EventType, o *Object) {
	w.t.Helper()
	w.rv++
	o.RV = w.rv
	for _, s := range []*Store{w.indexed, w.plain} {
		in := o
		if s == w.plain {
			in = clone(o)
		}
		if err := s.Apply(Event{Type: typ, Object: in, RV: w.rv}); err != nil {
			w.t.Fatal(err)
		}
	}
	if typ == Deleted {
		delete(w.cur, o.Key)
	} else {
		w.cur[o.Key] = o
	}
	w.record()
}

func (w *indexWorld) replace(objs []*Object) {
	w.t.Helper()
	w.rv++
	for _, o := range objs {
		o.RV = w.rv
	}
	var plain []*Object
	for _, o := range objs {
		plain = append(plain, clone(o))
	}
	if _, err := w.indexed.Replace(objs, w.rv); err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.plain.Replace(plain, w.rv); err != nil {
		w.t.Fatal(err)
	}
	w.cur = model{}
	for _, o := range objs {
		w.cur[o.Key] = o
	}
	w.record()
}

// checkIndexes: at rv, every shard's index of every field holds exactly
// (value, key) of each object of its key tree.
func (w *indexWorld) checkIndexes(rv uint64) {
	w.t.Helper()
	snaps, _, err := w.indexed.snapshots(rv)
	if err != nil {
		w.t.Fatalf("snapshots at %d: %v", rv, err)
	}
	var total int
	for si, sn := range snaps {
		total += sn.Len()
		for i, f := range sn.fields {
			var want, got []string
			sn.Range("", "", func(o *Object) bool {
				want = append(want, indexValue(o, f)+"|"+o.Key)
				return true
			})
			sort.Strings(want)
			var prev *indexEntry
			sn.index[i].Ascend(func(e indexEntry) bool {
				if prev != nil && (e.value < prev.value || e.value == prev.value && e.key <= prev.key) {
					w.t.Fatalf("rv %d shard %d index %s: %+v after %+v", rv, si, f, e, *prev)
				}
				prev = &e
				got = append(got, e.value+"|"+e.key)
				return true
			})
			sort.Strings(got)
			if !slices.Equal(got, want) {
				w.t.Fatalf("rv %d shard %d index %s:\n got  %v\n want %v", rv, si, f, got, want)
			}
		}
	}
	if total != len(w.states[rv]) {
		w.t.Fatalf("rv %d: %d objects, model has %d", rv, total, len(w.states[rv]))
	}
}

// indexCase is one read of an index.
type indexCase struct {
	rv        uint64
	ns, after string
	limit     int64
	iv        IndexValue
	byIndex   bool
	labeled   bool // also require label l=1
}

func (c indexCase) match(o *Object) bool {
	return indexValue(o, c.iv.Field) == c.iv.Value && (!c.labeled || o.Labels["l"] == "1")
}

func (c indexCase) request() ListRequest {
	return ListRequest{SnapshotRV: c.rv, Namespace: c.ns, StartKeyExclusive: c.after, Limit: c.limit,
		Match: c.match, Index: c.iv, ContinueByIndex: c.byIndex}
}

// checkCase compares List, Scan and LastKey of both stores with the model.
func (w *indexWorld) checkCase(c indexCase) {
	w.t.Helper()
	all, _ := w.states[c.rv].list(c.ns, c.after, nil)
	var withValue []*Object
	for _, o := range all {
		if indexValue(o, c.iv.Field) == c.iv.Value {
			withValue = append(withValue, o)
		}
	}
	// The rule: the apiserver reads its index (only objects with the
	// value), or a snapshot (every object of the range).
	var page []*Object
	var hasMore bool
	if c.byIndex {
		page, hasMore = apiserverPage(withValue, c.match, c.limit)
	} else {
		page, hasMore = apiserverPage(all, c.match, c.limit)
	}
	wantContinue := ""
	if hasMore {
		wantContinue = page[len(page)-1].Key
	}
	scanned, _ := apiserverPage(all, c.match, 0)
	// The greatest key that would continue a page, by the same rule.
	wantLast := ""
	whole, _ := w.states[c.rv].list(c.ns, "", nil)
	for _, o := range whole {
		if !c.byIndex || indexValue(o, c.iv.Field) == c.iv.Value {
			wantLast = o.Key
		}
	}
	for _, s := range []*Store{w.indexed, w.plain} {
		name := "indexed"
		if s == w.plain {
			name = "plain"
		}
		res, err := s.List(c.request())
		if err != nil {
			w.t.Fatalf("%s %+v: %v", name, c, err)
		}
		if got, want := objKeys(res.Items), objKeys(page); !slices.Equal(got, want) {
			w.t.Fatalf("%s %+v: items\n got  %v\n want %v", name, c, got, want)
		}
		if res.ContinueKey != wantContinue || res.RemainingItemCount != nil {
			w.t.Fatalf("%s %+v: continue %q remaining %v, want %q and none", name, c, res.ContinueKey, res.RemainingItemCount, wantContinue)
		}
		if res.Items == nil {
			w.t.Fatalf("%s %+v: nil items", name, c)
		}
		var got []*Object
		if _, err := s.Scan(c.request(), func(o *Object) bool { got = append(got, o); return true }); err != nil {
			w.t.Fatal(err)
		}
		if g, w2 := objKeys(got), objKeys(scanned); !slices.Equal(g, w2) {
			w.t.Fatalf("%s %+v: scan\n got  %v\n want %v", name, c, g, w2)
		}
		lk, err := s.LastKey(c.request())
		if err != nil {
			w.t.Fatal(err)
		}
		if lk != wantLast {
			w.t.Fatalf("%s %+v: LastKey %q, want %q", name, c, lk, wantLast)
		}
	}
}

func objKeys(objs []*Object) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.Key+"@"+itoa(o.RV))
	}
	return out
}

var (
	indexNamespaces = []string{"", "a", "a-b", "ab", "b"}
	indexNodes      = []string{"", "-", "n1", "n2", "n3"}
	indexPhases     = []string{"Pending", "Running"}
)

// runIndexScript drives a world from a stream of choices (next(n) is in
// [0, n); ok false ends the script): writes of every kind, then reads of
// every kind at random states, and the indexes checked at every state.
func runIndexScript(t testing.TB, next func(n int) (int, bool)) {
	shards, ok := next(5)
	if !ok {
		return
	}
	w := newIndexWorld(t, shards+1)
	name := func(n int) string { return "o" + itoa(uint64(n)) }
	for {
		op, ok := next(12)
		if !ok {
			break
		}
		switch {
		case op < 7: // add or modify, the value changed or not
			ns, _ := next(len(indexNamespaces))
			n, _ := next(24)
			node, _ := next(len(indexNodes))
			phase, _ := next(len(indexPhases))
			label, _ := next(2)
			w.apply(Modified, indexedObj(indexNamespaces[ns], name(n), indexNodes[node], indexPhases[phase], itoa(uint64(label)), 0))
		case op < 10: // delete (possibly absent)
			ns, _ := next(len(indexNamespaces))
			n, _ := next(24)
			w.apply(Deleted, obj(indexNamespaces[ns], name(n), 0))
		case op < 11: // relist: some objects kept, some changed, some gone
			var objs []*Object
			for _, o := range w.cur {
				switch k, _ := next(3); k {
				case 0:
					objs = append(objs, clone(o))
				case 1:
					node, _ := next(len(indexNodes))
					objs = append(objs, indexedObj(o.Namespace, o.Name, indexNodes[node], "Running", "1", 0))
				}
			}
			sort.Slice(objs, func(i, j int) bool { return objs[i].Key < objs[j].Key })
			w.replace(objs)
		default: // reads
			for range 8 {
				r, _ := next(len(w.rvs) + 1)
				c := indexCase{}
				if r < len(w.rvs) {
					c.rv = w.rvs[r]
				}
				if c.rv == 0 {
					c.rv = w.rv
				}
				ns, _ := next(len(indexNamespaces) + 1)
				if ns < len(indexNamespaces) {
					c.ns = indexNamespaces[ns]
				}
				if a, _ := next(3); a == 0 {
					an, _ := next(len(indexNamespaces))
					n, _ := next(24)
					c.after = keyhash.Key(indexNamespaces[an], name(n))
				}
				l, _ := next(6)
				c.limit = int64(l)
				f, _ := next(len(testIndexes) + 1)
				switch {
				case f == len(testIndexes):
					c.iv = IndexValue{Field: "spec.other"}
				case testIndexes[f] == "spec.nodeName":
					v, _ := next(len(indexNodes))
					c.iv = IndexValue{Field: "spec.nodeName", Value: strings.TrimPrefix(indexNodes[v], "-")}
				case testIndexes[f] == "status.phase":
					v, _ := next(len(indexPhases) + 1)
					c.iv = IndexValue{Field: "status.phase"}
					if v < len(indexPhases) {
						c.iv.Value = indexPhases[v]
					}
				default:
					n, _ := next(24)
					c.iv = IndexValue{Field: "metadata.name", Value: name(n)}
				}
				b, _ := next(2)
				lb, _ := next(2)
				c.byIndex, c.labeled = b == 1, lb == 1
				w.checkCase(c)
			}
		}
	}
	for _, rv := range w.rvs {
		if rv > 0 {
			w.checkIndexes(rv)
		}
	}
}

// TestIndexAgainstModel: random writes and reads, every page, scan and
// last key of an indexed read equal to the model's under both
// continuation rules, the indexes right at every state.
func TestIndexAgainstModel(t *testing.T) {
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 7))
		steps := 0
		runIndexScript(t, func(n int) (int, bool) {
			steps++
			if steps > 4000 {
				return 0, false
			}
			return rng.IntN(n), true
		})
	}
}

// FuzzIndexedList is TestIndexAgainstModel with the choices from the
// fuzzer.
func FuzzIndexedList(f *testing.F) {
	f.Add([]byte{1, 0, 0, 3, 2, 0, 1, 0, 1, 2, 2, 0, 0, 11, 0, 0, 5, 1, 2, 3, 1, 1})
	f.Add([]byte{3, 0, 1, 1, 2, 1, 1, 0, 2, 1, 3, 0, 0, 10, 1, 2, 0, 11, 2, 0, 2, 2, 0, 2, 1, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		runIndexScript(t, func(n int) (int, bool) {
			if len(data) == 0 {
				return 0, false
			}
			b := data[0]
			data = data[1:]
			return int(b) % n, true
		})
	})
}

// TestIndexFollowsChanges walks one object through every change the index
// must follow and checks each state, earlier ones included.
func TestIndexFollowsChanges(t *testing.T) {
	w := newIndexWorld(t, 3)
	w.apply(Added, indexedObj("ns", "p", "-", "Pending", "0", 0))   // no node: indexed under ""
	w.apply(Modified, indexedObj("ns", "p", "", "Pending", "1", 0)) // "" and absent are one value
	w.apply(Modified, indexedObj("ns", "p", "n1", "Running", "1", 0))
	w.apply(Modified, indexedObj("ns", "p", "n1", "Running", "0", 0)) // value unchanged
	w.apply(Added, indexedObj("ns", "q", "n1", "Running", "0", 0))
	w.apply(Modified, indexedObj("ns", "p", "n2", "Running", "0", 0))
	w.apply(Deleted, obj("ns", "q", 0))
	w.apply(Deleted, obj("ns", "absent", 0))
	w.replace([]*Object{indexedObj("ns", "p", "n3", "Running", "0", 0), indexedObj("other", "r", "n1", "Failed", "1", 0)})
	for _, rv := range w.rvs[1:] {
		w.checkIndexes(rv)
		for _, v := range []string{"", "n1", "n2", "n3"} {
			for _, byIndex := range []bool{false, true} {
				w.checkCase(indexCase{rv: rv, iv: IndexValue{Field: "spec.nodeName", Value: v}, limit: 1, byIndex: byIndex})
			}
		}
	}
	// State by state, as an exact read or a continue token sees it.
	want := map[uint64][]string{
		1: {""}, 2: {""}, 3: {"n1"}, 4: {"n1"}, 5: {"n1", "n1"}, 6: {"n1", "n2"}, 7: {"n2"}, 8: {"n2"}, 9: {"n1", "n3"},
	}
	for rv, nodes := range want {
		var got []string
		for _, v := range []string{"", "n1", "n2", "n3"} {
			_, err := w.indexed.Scan(ListRequest{SnapshotRV: rv, Index: IndexValue{Field: "spec.nodeName", Value: v}}, func(*Object) bool {
				got = append(got, v)
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, nodes) {
			t.Errorf("rv %d: nodes %v, want %v", rv, got, nodes)
		}
	}
}

// TestIndexHistoryPrune: states that leave the history window take their
// index with them, the ones left still read right, and an expired read of
// an index is the store's ExpiredError.
func TestIndexHistoryPrune(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	s, err := New(Options{Shards: 2, HistoryWindow: time.Minute, Clock: clk, Indexes: []string{"spec.nodeName"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		mustApply(t, s, Modified, indexedObj("ns", "p"+itoa(i%3), "n"+itoa(i%2), "Running", "0", i))
		clk.SetTime(clk.Now().Add(10 * time.Second))
	}
	clk.SetTime(clk.Now().Add(45 * time.Second))
	read := func(rv uint64) ([]string, error) {
		var got []string
		_, err := s.Scan(ListRequest{SnapshotRV: rv, Index: IndexValue{Field: "spec.nodeName", Value: "n1"}}, func(o *Object) bool {
			got = append(got, o.Key+"@"+itoa(o.RV))
			return true
		})
		return got, err
	}
	var expired *ExpiredError
	if _, err := read(2); !errors.As(err, &expired) {
		t.Fatalf("read at pruned RV 2: %v, want ExpiredError", err)
	}
	got, err := read(9)
	if err != nil {
		t.Fatal(err)
	}
	// At RV 9: p0@9 (n1), p1@7 (n1), p2@8 (n0).
	if want := []string{"ns/p0@9", "ns/p1@7"}; !slices.Equal(got, want) {
		t.Fatalf("at RV 9: %v, want %v", got, want)
	}
}

// An index read of a continue page follows its token's snapshot: a page
// read later at that RV is the same whatever changed since.
func TestIndexReadAtTokenSnapshot(t *testing.T) {
	s, err := New(Options{Shards: 4, HistoryWindow: time.Hour, Indexes: []string{"spec.nodeName"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(20) {
		mustApply(t, s, Added, indexedObj("ns", fmt.Sprintf("p%02d", i), "n"+itoa(i%2), "Running", "0", i+1))
	}
	req := ListRequest{Limit: 3, Match: func(o *Object) bool { return o.Fields["spec.nodeName"] == "n0" }, Index: IndexValue{Field: "spec.nodeName", Value: "n0"}, ContinueByIndex: true}
	first, err := s.List(req)
	if err != nil {
		t.Fatal(err)
	}
	// Move every n0 pod to n1 and add new n0 pods after the token's key.
	for i := uint64(0); i < 20; i += 2 {
		mustApply(t, s, Modified, indexedObj("ns", fmt.Sprintf("p%02d", i), "n1", "Running", "0", 100+i))
		mustApply(t, s, Added, indexedObj("ns", fmt.Sprintf("p%02dx", i), "n0", "Running", "0", 101+i))
	}
	req.SnapshotRV, req.StartKeyExclusive, req.ContinueByIndex = first.RV, first.ContinueKey, false
	var got []string
	for {
		page, err := s.List(req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, objKeys(page.Items)...)
		if page.ContinueKey == "" {
			break
		}
		req.StartKeyExclusive = page.ContinueKey
	}
	want := []string{"ns/p06@7", "ns/p08@9", "ns/p10@11", "ns/p12@13", "ns/p14@15", "ns/p16@17", "ns/p18@19"}
	if !slices.Equal(got, want) {
		t.Fatalf("pages at RV %d: %v, want %v", first.RV, got, want)
	}
}

// TestIndexStats counts entries, distinct values over shards and bytes.
func TestIndexStats(t *testing.T) {
	s, err := New(Options{Shards: 4, Indexes: []string{"spec.nodeName", "status.phase"}})
	if err != nil {
		t.Fatal(err)
	}
	var objs []*Object
	for i := range 100 {
		node := "n" + itoa(uint64(i%7))
		if i%10 == 0 {
			node = "-"
		}
		objs = append(objs, indexedObj("ns", fmt.Sprintf("p%03d", i), node, "Running", "0", 1))
	}
	if _, err := s.Replace(objs, 1); err != nil {
		t.Fatal(err)
	}
	stats := s.IndexStats()
	if len(stats) != 2 || stats[0].Field != "spec.nodeName" || stats[1].Field != "status.phase" {
		t.Fatalf("stats %+v", stats)
	}
	// Nodes n0..n6 and "" for the pods without one.
	if st := stats[0]; st.Entries != 100 || st.Values != 8 || st.Bytes < 100*indexBytesPerEntry {
		t.Errorf("spec.nodeName: %+v", st)
	}
	if st := stats[1]; st.Entries != 100 || st.Values != 1 {
		t.Errorf("status.phase: %+v", st)
	}
	if got := newStore(t, 2).IndexStats(); len(got) != 0 {
		t.Errorf("a store without indexes: %+v", got)
	}
}

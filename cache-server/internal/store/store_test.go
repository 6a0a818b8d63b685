package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
)

func newStore(t testing.TB, shards int) *Store {
	t.Helper()
	s, err := New(Options{Shards: shards, HistoryWindow: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// model is the obviously-correct reference: a sorted slice.
type model map[string]*Object

func (m model) list(ns, after string, match func(*Object) bool) (all []*Object, matched []*Object) {
	prefix := keyhash.NamespacePrefix(ns)
	for _, o := range m {
		if strings.HasPrefix(o.Key, prefix) && o.Key > after {
			all = append(all, o)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Key < all[j].Key })
	for _, o := range all {
		if match == nil || match(o) {
			matched = append(matched, o)
		}
	}
	return all, matched
}

func TestNewRejectsNoShards(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New with 0 shards must fail")
	}
}

// TestListAgainstModel pages through random data with random namespaces,
// selectors and limits and compares every page with the reference model,
// including ContinueKey and RemainingItemCount.
func TestListAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	namespaces := []string{"", "a", "a-b", "a.b", "ab", "b"}
	for iter := range 40 {
		shards := 1 + rng.IntN(7)
		s := newStore(t, shards)
		m := model{}
		var rv uint64
		for range rng.IntN(300) {
			rv++
			ns := namespaces[rng.IntN(len(namespaces))]
			o := obj(ns, "o"+itoa(uint64(rng.IntN(200))), rv)
			o.Labels = map[string]string{"even": itoa(uint64(rng.IntN(2)))}
			if _, ok := m[o.Key]; ok && rng.IntN(4) == 0 {
				mustApply(t, s, Deleted, o)
				delete(m, o.Key)
				continue
			}
			mustApply(t, s, Modified, o)
			m[o.Key] = o
		}
		for _, ns := range namespaces {
			for _, sel := range []func(*Object) bool{nil, func(o *Object) bool { return o.Labels["even"] == "0" }, func(*Object) bool { return false }} {
				limit := int64(rng.IntN(12))
				// Counting the rest per page, and carrying each page's
				// count to the next (as continue tokens do).
				checkPaging(t, iter, s, m, ns, limit, sel, false)
				checkPaging(t, iter, s, m, ns, limit, sel, true)
			}
		}
	}
}

func checkPaging(t *testing.T, iter int, s *Store, m model, ns string, limit int64, match func(*Object) bool, carry bool) {
	t.Helper()
	_, wantAll := m.list(ns, "", match)
	var got []*Object
	after := ""
	var known *int64
	for page := 0; ; page++ {
		if page > 1000 {
			t.Fatal("paging does not terminate")
		}
		req := ListRequest{Namespace: ns, StartKeyExclusive: after, Limit: limit, Match: match}
		if carry {
			req.RemainingAfterStart = known
		}
		res, err := s.List(req)
		if err != nil {
			t.Fatal(err)
		}
		known = res.RemainingItemCount
		if res.Items == nil {
			t.Fatal("Items is nil")
		}
		if res.RV != s.AppliedRV() {
			t.Fatalf("RV %d, applied %d", res.RV, s.AppliedRV())
		}
		all, _ := m.list(ns, after, match)
		// Expected page, as the cacher computes it.
		var want []*Object
		hasMore := false
		for i, o := range all {
			if match == nil || match(o) {
				want = append(want, o)
			}
			if limit > 0 && int64(len(want)) >= limit {
				hasMore = i < len(all)-1
				break
			}
		}
		if len(res.Items) != len(want) {
			t.Fatalf("iter %d ns %q limit %d page %d: %d items, want %d", iter, ns, limit, page, len(res.Items), len(want))
		}
		for i := range want {
			if res.Items[i] != want[i] {
				t.Fatalf("item %d = %s, want %s", i, res.Items[i].Key, want[i].Key)
			}
		}
		got = append(got, res.Items...)
		if !hasMore {
			if res.ContinueKey != "" || res.RemainingItemCount != nil {
				t.Fatalf("no more items but continue=%q remaining=%v", res.ContinueKey, res.RemainingItemCount)
			}
			break
		}
		if res.ContinueKey != want[len(want)-1].Key {
			t.Fatalf("ContinueKey %q, want %q", res.ContinueKey, want[len(want)-1].Key)
		}
		if match == nil {
			wantRemaining := int64(len(all)) - limit
			if res.RemainingItemCount == nil || *res.RemainingItemCount != wantRemaining {
				t.Fatalf("RemainingItemCount %v, want %d", res.RemainingItemCount, wantRemaining)
			}
		} else if res.RemainingItemCount != nil {
			t.Fatal("RemainingItemCount set for a filtered list")
		}
		after = res.ContinueKey
	}
	if len(got) != len(wantAll) {
		t.Fatalf("paged %d items, want %d", len(got), len(wantAll))
	}
}

// TestListSelectorContinueWithoutMoreMatches pins the cacher's behaviour: with
// a selector, a page that fills the limit returns a continue key whenever any
// item follows, even if nothing after it matches (the next page is empty).
func TestListSelectorContinueWithoutMoreMatches(t *testing.T) {
	s := newStore(t, 3)
	mustApply(t, s, Added, &Object{Key: "ns/a", Namespace: "ns", Name: "a", RV: 1, Labels: map[string]string{"x": "y"}})
	mustApply(t, s, Added, &Object{Key: "ns/b", Namespace: "ns", Name: "b", RV: 2})
	match := func(o *Object) bool { return o.Labels["x"] == "y" }
	res, err := s.List(ListRequest{Limit: 1, Match: match})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 1 || res.ContinueKey != "ns/a" || res.RemainingItemCount != nil {
		t.Fatalf("page 1: %+v", res)
	}
	res, err = s.List(ListRequest{Limit: 1, Match: match, StartKeyExclusive: res.ContinueKey})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Items) != 0 || res.ContinueKey != "" {
		t.Fatalf("page 2: %+v", res)
	}
}

// SkipCount keeps the page and its continuation and leaves the count to
// the caller.
func TestListSkipCount(t *testing.T) {
	s := newStore(t, 3)
	for i, name := range []string{"a", "b", "c"} {
		mustApply(t, s, Added, &Object{Key: "ns/" + name, Namespace: "ns", Name: name, RV: uint64(i + 1)})
	}
	counted, err := s.List(ListRequest{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	skipped, err := s.List(ListRequest{Limit: 1, SkipCount: true})
	if err != nil {
		t.Fatal(err)
	}
	if counted.RemainingItemCount == nil || *counted.RemainingItemCount != 2 {
		t.Fatalf("counted: %+v", counted)
	}
	if skipped.RemainingItemCount != nil || skipped.ContinueKey != counted.ContinueKey || len(skipped.Items) != 1 || skipped.Items[0] != counted.Items[0] {
		t.Fatalf("skipped: %+v, counted %+v", skipped, counted)
	}
}

// TestListAtSnapshotWhileWriting pages at a fixed RV while writes continue
// and checks the pages describe exactly the state at that RV.
func TestListAtSnapshotWhileWriting(t *testing.T) {
	s := newStore(t, 4)
	m := model{}
	var rv uint64
	for i := range 100 {
		rv++
		o := obj("ns", "o"+itoa(uint64(i)), rv)
		mustApply(t, s, Added, o)
		m[o.Key] = o
	}
	first, err := s.List(ListRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if *first.RemainingItemCount != 90 {
		t.Fatalf("remaining %d", *first.RemainingItemCount)
	}
	got := first.Items
	snapRV := first.RV
	after := first.ContinueKey
	for i := 0; after != ""; i++ {
		// Interleave writes: delete, modify and add objects.
		rv++
		mustApply(t, s, Deleted, obj("ns", "o"+itoa(uint64(i*3)), rv))
		rv++
		mustApply(t, s, Modified, obj("ns", "o"+itoa(uint64(i*3+1)), rv))
		rv++
		mustApply(t, s, Added, obj("ns", "p"+itoa(uint64(i)), rv))
		res, err := s.List(ListRequest{SnapshotRV: snapRV, StartKeyExclusive: after, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if res.RV != snapRV {
			t.Fatalf("RV %d, want %d", res.RV, snapRV)
		}
		got = append(got, res.Items...)
		after = res.ContinueKey
	}
	_, want := m.list("", "", nil)
	if len(got) != len(want) {
		t.Fatalf("got %d items, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("item %d: %s@%d, want %s@%d", i, got[i].Key, got[i].RV, want[i].Key, want[i].RV)
		}
	}
	o, at, err := s.Get("ns/o0", snapRV)
	if err != nil || o == nil || o.RV != 1 || at != snapRV {
		t.Fatalf("Get at snapshot: %v %d %v", o, at, err)
	}
	o, _, err = s.Get("ns/o0", 0)
	if err != nil || o != nil {
		t.Fatalf("Get latest of deleted object: %v %v", o, err)
	}
}

func TestStoreExpiredAndFuture(t *testing.T) {
	t0 := time.Unix(0, 0)
	clk := clocktesting.NewFakePassiveClock(t0)
	s, err := New(Options{Shards: 2, HistoryWindow: time.Minute, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(i), i))
	}
	clk.SetTime(t0.Add(2 * time.Minute))
	mustApply(t, s, Added, obj("ns", "late", 11))
	if _, err := s.List(ListRequest{SnapshotRV: 5}); !apierrors.IsResourceExpired(err) {
		t.Fatalf("List at old RV: %v", err)
	}
	if _, _, err := s.Get("ns/o1", 5); !apierrors.IsResourceExpired(err) {
		t.Fatalf("Get at old RV: %v", err)
	}
	_, err = s.List(ListRequest{SnapshotRV: 12})
	var tl *TooLargeResourceVersionError
	if !errors.As(err, &tl) || tl.Current != 11 {
		t.Fatalf("List at future RV: %#v", err)
	}
	res, err := s.List(ListRequest{SnapshotRV: 11})
	if err != nil || len(res.Items) != 11 {
		t.Fatalf("List at applied RV: %d %v", len(res.Items), err)
	}
}

func TestStoreProgressAndWait(t *testing.T) {
	s := newStore(t, 4)
	mustApply(t, s, Added, obj("ns", "a", 7))
	// Every shard saw RV 7, not only the owner.
	for i, st := range s.Stats() {
		if st.AppliedRV != 7 {
			t.Fatalf("shard %d at %d", i, st.AppliedRV)
		}
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitForRV(context.Background(), 9) }()
	time.Sleep(10 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("returned early: %v", err)
	default:
	}
	s.MarkProgress(9)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not woken")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	var tl *TooLargeResourceVersionError
	if err := s.WaitForRV(ctx, 50); !errors.As(err, &tl) || tl.Current != 9 || tl.RV != 50 {
		t.Fatalf("WaitForRV timeout: %#v", err)
	}
}

func TestStoreReplace(t *testing.T) {
	s := newStore(t, 3)
	for i := uint64(1); i <= 20; i++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(i), i))
	}
	var next []*Object
	for i := uint64(5); i <= 25; i++ {
		rv := i
		if i%5 == 0 {
			rv = 100 + i
		}
		next = append(next, obj("ns", "o"+itoa(i), rv))
	}
	evs, err := s.Replace(next, 200)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[EventType]int{}
	for i, e := range evs {
		counts[e.Type]++
		if i > 0 && evs[i-1].Object.Key >= e.Object.Key {
			t.Fatal("events not in key order")
		}
	}
	// deleted o1..o4, modified o5,o10,o15,o20, added o21..o25
	if counts[Deleted] != 4 || counts[Modified] != 4 || counts[Added] != 5 {
		t.Fatalf("counts %v", counts)
	}
	if s.AppliedRV() != 200 {
		t.Fatalf("AppliedRV %d", s.AppliedRV())
	}
	res, _ := s.List(ListRequest{})
	if len(res.Items) != 21 {
		t.Fatalf("%d items after replace", len(res.Items))
	}
	if _, err := s.Replace(nil, 100); !errors.Is(err, ErrStaleEvent) {
		t.Fatalf("stale replace: %v", err)
	}
	var total int64
	for _, st := range s.Stats() {
		total += int64(st.Objects)
	}
	if total != 21 {
		t.Fatalf("stats objects %d", total)
	}
}

func benchStore(b testing.TB, n, shards int) *Store {
	s, err := New(Options{Shards: shards, HistoryWindow: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	raw := make([]byte, 2048)
	for i := range n {
		ns := "ns-" + itoa(uint64(i%50))
		name := "pod-" + itoa(uint64(i))
		o := &Object{Key: keyhash.Key(ns, name), Namespace: ns, Name: name, RV: uint64(i + 1), Raw: raw,
			Labels: map[string]string{"app": "a" + itoa(uint64(i%10))}}
		if err := s.Apply(Event{Type: Added, Object: o, RV: o.RV}); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// The result is sized once: a page by its limit, an unfiltered
// cluster-wide read by the objects held, anything else by its appends.
func TestItemsCapacity(t *testing.T) {
	s := benchStore(t, 1000, 4)
	snaps, _, err := s.snapshots(0)
	if err != nil {
		t.Fatal(err)
	}
	match := func(*Object) bool { return true }
	for _, tc := range []struct {
		name   string
		prefix string
		req    ListRequest
		want   int
	}{
		{"all", "", ListRequest{}, 1000},
		{"page", "", ListRequest{Limit: 500}, 500},
		{"page larger than the resource", "", ListRequest{Limit: 5000}, 1000},
		{"filtered page", "", ListRequest{Limit: 100, Match: match}, 100},
		{"filtered", "", ListRequest{Match: match}, 0},
		{"indexed", "", ListRequest{Index: IndexValue{Field: "spec.nodeName", Value: "n"}}, 0},
		{"namespace", keyhash.NamespacePrefix("ns-1"), ListRequest{Namespace: "ns-1"}, 0},
	} {
		if got := itemsCapacity(snaps, tc.prefix, tc.req); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	res, err := s.List(ListRequest{})
	if err != nil || len(res.Items) != 1000 || cap(res.Items) != 1000 {
		t.Fatalf("full list: %d items in %d, %v", len(res.Items), cap(res.Items), err)
	}
}

// The merge's batch buffers go back to the pool cleared: a pooled buffer
// holding objects would keep replaced ones alive. (Checked on the buffers
// themselves: under -race a sync.Pool drops a quarter of what it is given,
// so what Get returns proves nothing.)
func TestMergeGivesBatchBuffersBackCleared(t *testing.T) {
	s := benchStore(t, 3000, 4)
	snaps, _, err := s.snapshots(0)
	if err != nil {
		t.Fatal(err)
	}
	var pool sync.Pool
	for name, limit := range map[string]int64{"all": 0, "a page": 100} {
		m := newMerger(&pool, snaps, "", "", limit, IndexValue{})
		for n := int64(0); m.next() != nil && (limit == 0 || n < limit); n++ {
		}
		var bufs [][]*Object
		for _, c := range m.all {
			if cap(c.buf) != maxBatch {
				t.Fatalf("%s: a cursor's buffer holds %d, want %d", name, cap(c.buf), maxBatch)
			}
			bufs = append(bufs, c.buf[:maxBatch])
		}
		m.release()
		for i, c := range m.all {
			if c.buf != nil {
				t.Fatalf("%s: cursor %d kept its buffer", name, i)
			}
			for j, o := range bufs[i] {
				if o != nil {
					t.Fatalf("%s: cursor %d's buffer still holds %s at %d", name, i, o.Key, j)
				}
			}
		}
	}
}

// BenchmarkList10kLimit500 is a full paginated walk (20 pages) of 10k objects.
func BenchmarkList10kLimit500(b *testing.B) {
	for _, shards := range []int{1, 8} {
		b.Run("shards="+itoa(uint64(shards)), func(b *testing.B) {
			s := benchStore(b, 10000, shards)
			b.ReportAllocs()
			for b.Loop() {
				res, err := s.List(ListRequest{Limit: 500})
				if err != nil {
					b.Fatal(err)
				}
				for res.ContinueKey != "" {
					res, err = s.List(ListRequest{SnapshotRV: res.RV, StartKeyExclusive: res.ContinueKey, Limit: 500})
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkListAll is one unpaginated LIST of 10k objects, what a flood of
// full LISTs repeats: its allocations are the result and the merge.
func BenchmarkListAll(b *testing.B) {
	for _, shards := range []int{1, 8} {
		b.Run("shards="+itoa(uint64(shards)), func(b *testing.B) {
			s := benchStore(b, 10000, shards)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.List(ListRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkListFirstPage is one page of 500 out of 10k (includes the
// RemainingItemCount walk), with and without a selector matching 10%.
func BenchmarkListFirstPage(b *testing.B) {
	s := benchStore(b, 10000, 8)
	for _, tc := range []struct {
		name  string
		match func(*Object) bool
	}{{"all", nil}, {"selector10pct", func(o *Object) bool { return o.Labels["app"] == "a3" }}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.List(ListRequest{Limit: 500, Match: tc.match}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkApply measures ingestion: one Modified event per op on a store of
// 10k objects, snapshot kept per event.
func BenchmarkApply(b *testing.B) {
	for _, shards := range []int{1, 8} {
		b.Run("shards="+itoa(uint64(shards)), func(b *testing.B) {
			s := benchStore(b, 10000, shards)
			raw := make([]byte, 2048)
			rv := uint64(10000)
			objs := make([]*Object, 10000)
			for i := range objs {
				ns := "ns-" + itoa(uint64(i%50))
				name := "pod-" + itoa(uint64(i))
				objs[i] = &Object{Key: keyhash.Key(ns, name), Namespace: ns, Name: name, Raw: raw}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rv++
				o := *objs[i%len(objs)]
				o.RV = rv
				if err := s.Apply(Event{Type: Modified, Object: &o, RV: rv}); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func TestScan(t *testing.T) {
	s := newStore(t, 5)
	m := model{}
	for i := uint64(1); i <= 3000; i++ {
		ns := []string{"a", "a-b", "b"}[i%3]
		o := obj(ns, "o"+itoa(i), i)
		mustApply(t, s, Added, o)
		m[o.Key] = o
	}
	odd := func(o *Object) bool { return o.RV%2 == 1 }
	var got []*Object
	rv, err := s.Scan(ListRequest{Namespace: "a", StartKeyExclusive: "a/o2", Limit: 1, Match: odd}, func(o *Object) bool {
		got = append(got, o)
		return true
	})
	if err != nil || rv != 3000 {
		t.Fatalf("Scan: %d %v", rv, err)
	}
	_, want := m.list("a", "a/o2", odd)
	if len(got) != len(want) {
		t.Fatalf("Scan returned %d, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("item %d: %s, want %s", i, got[i].Key, want[i].Key)
		}
	}
	n := 0
	if _, err := s.Scan(ListRequest{}, func(*Object) bool { n++; return n < 10 }); err != nil || n != 10 {
		t.Fatalf("early stop: %d %v", n, err)
	}
	if _, err := s.Scan(ListRequest{SnapshotRV: 5000}, func(*Object) bool { return true }); err == nil {
		t.Fatal("Scan at a future RV must fail")
	}
}

// TestConcurrentReadersAndWriter runs paginated readers at fixed snapshots
// while one writer keeps applying events; run with -race. Each object's RV is
// written into every version of it, so a reader can check that a page at
// snapshot rv never shows a state newer than rv and that pages of one
// snapshot never change.
func TestConcurrentReadersAndWriter(t *testing.T) {
	s := newStore(t, 4)
	const n = 200
	for i := uint64(1); i <= n; i++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(i), i))
	}
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		rv := uint64(n)
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			default:
			}
			rv++
			i := rv % n
			var err error
			if rv%5 == 0 {
				err = s.Apply(Event{Type: Deleted, Object: obj("ns", "o"+itoa(i), rv), RV: rv})
			} else {
				err = s.Apply(Event{Type: Modified, Object: obj("ns", "o"+itoa(i), rv), RV: rv})
			}
			if err != nil {
				writerDone <- err
				return
			}
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 50 {
				first, err := s.List(ListRequest{Limit: 7})
				if err != nil {
					errs <- err
					return
				}
				var all []*Object
				all = append(all, first.Items...)
				after := first.ContinueKey
				for after != "" {
					res, err := s.List(ListRequest{SnapshotRV: first.RV, StartKeyExclusive: after, Limit: 7})
					if err != nil {
						errs <- err
						return
					}
					all = append(all, res.Items...)
					after = res.ContinueKey
				}
				again, err := s.List(ListRequest{SnapshotRV: first.RV})
				if err != nil {
					errs <- err
					return
				}
				if len(again.Items) != len(all) {
					errs <- fmt.Errorf("snapshot %d: paged %d items, full list %d", first.RV, len(all), len(again.Items))
					return
				}
				for i, o := range all {
					if o.RV > first.RV || again.Items[i] != o {
						errs <- fmt.Errorf("snapshot %d: item %s@%d inconsistent", first.RV, o.Key, o.RV)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
}

func TestStoreReplaceRejectsDuplicatesAtomically(t *testing.T) {
	s := newStore(t, 4)
	for i := uint64(1); i <= 20; i++ {
		mustApply(t, s, Added, obj("ns", "o"+itoa(i), i))
	}
	objs := []*Object{obj("ns", "x1", 30), obj("ns", "x2", 30), obj("ns", "x1", 30)}
	if _, err := s.Replace(objs, 30); err == nil {
		t.Fatal("duplicate keys must fail")
	}
	res, err := s.List(ListRequest{})
	if err != nil || len(res.Items) != 20 || s.AppliedRV() != 20 {
		t.Fatalf("store changed by a failed Replace: %d items at %d (%v)", len(res.Items), s.AppliedRV(), err)
	}
}

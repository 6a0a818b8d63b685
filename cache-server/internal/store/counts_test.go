package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCountsFollowChanges: after random adds, updates that move objects
// between namespaces' values, deletes and a relist, Count and Sizes equal
// a brute-force count of the latest state.
func TestCountsFollowChanges(t *testing.T) {
	s, err := New(Options{Shards: 4, HistoryWindow: time.Hour, Indexes: []string{"spec.nodeName"}})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[string]*Object{}
	// Object i lives in namespace ns-(i%5); an update may move it to
	// another node (or unschedule it).
	mk := func(i int, rv uint64) *Object {
		o := obj(fmt.Sprintf("ns-%d", i%5), fmt.Sprintf("p-%d", i), rv)
		if node := rng.IntN(8); node > 0 {
			o.Fields = map[string]string{"spec.nodeName": fmt.Sprintf("node-%d", node)}
		}
		return o
	}
	check := func(when string) {
		t.Helper()
		for _, ns := range []string{"", "ns-0", "ns-3", "ns-none"} {
			for _, iv := range []IndexValue{{}, {Field: "spec.nodeName", Value: "node-2"}, {Field: "spec.nodeName", Value: ""}} {
				var want int64
				for _, o := range live {
					if (ns == "" || o.Namespace == ns) && (iv.Field == "" || o.FieldSet().Get(iv.Field) == iv.Value) {
						want++
					}
				}
				got, _ := s.Count(ns, iv)
				// Per shard the estimate is the smaller of the namespace's
				// and the value's counts: exact for one of them alone, an
				// upper bound for both.
				if (ns == "" || iv.Field == "") && got != want || got < want {
					t.Fatalf("%s: Count(%q, %v) = %d, want %d", when, ns, iv, got, want)
				}
			}
		}
		sz := s.Sizes()
		if sz.Objects != int64(len(live)) {
			t.Fatalf("%s: Sizes().Objects = %d, want %d", when, sz.Objects, len(live))
		}
		if sz.Namespaces < 1 || sz.Namespaces > 5 || sz.Values["spec.nodeName"] < 1 || sz.Values["spec.nodeName"] > 8 {
			t.Fatalf("%s: Sizes() = %+v", when, sz)
		}
	}
	rv := uint64(1)
	for step := 0; step < 3000; step++ {
		rv++
		i := rng.IntN(300)
		key := obj(fmt.Sprintf("ns-%d", i%5), fmt.Sprintf("p-%d", i), 0).Key
		if prev, ok := live[key]; ok && rng.IntN(4) == 0 {
			if err := s.Apply(Event{Type: Deleted, Object: prev, RV: rv}); err != nil {
				t.Fatal(err)
			}
			delete(live, key)
			continue
		}
		o := mk(i, rv)
		live[o.Key] = o
		if err := s.Apply(Event{Type: Added, Object: o, RV: rv}); err != nil {
			t.Fatal(err)
		}
	}
	if len(live) < 100 || len(live) > 300 {
		t.Fatalf("%d live objects: the walk did not mix adds and deletes", len(live))
	}
	check("after changes")
	var objs []*Object
	next := map[string]*Object{}
	rv++
	for i := 0; i < 200; i++ {
		o := mk(i, rv)
		next[o.Key] = o
		objs = append(objs, o)
	}
	if _, err := s.Replace(objs, rv); err != nil {
		t.Fatal(err)
	}
	live = next
	check("after a relist")
}

package store

import (
	"container/heap"
	"strings"

	"github.com/google/btree"
)

// A field index is, in every shard and at every resourceVersion the shard
// can serve, a copy-on-write B-tree of (value, key) entries for one field:
// the objects with one value are a contiguous run in key order, so a LIST
// that pins the value walks only them, and shards merge by key exactly as
// an unindexed read does.
//
// Entries hold the value and the key, not the *Object: an update that
// leaves the value alone (most updates: a pod's status changes, its node
// does not) does not touch the index, so it costs neither a B-tree path
// copy per index nor history memory. A reader finds the object by its key
// in the key tree of the same state (O(log n) per item read).

// indexEntry is one object in a field index. Both strings are the
// object's own (its Key, its field value), not copies; after an update
// that kept the value, they are those of the object's earlier state.
type indexEntry struct {
	value, key string
}

func lessIndexEntry(a, b indexEntry) bool {
	if a.value != b.value {
		return a.value < b.value
	}
	return a.key < b.key
}

type indexTree = btree.BTreeG[indexEntry]

func newIndexTree() *indexTree { return btree.NewG(btreeDegree, lessIndexEntry) }

// indexValue is the value o is indexed under for field: what a field
// selector compares (FieldSet), "" when o has no such field — as the
// apiserver's index puts pods without a node under "", and as "field="
// matches an object without the field.
func indexValue(o *Object, field string) string { return o.FieldSet().Get(field) }

// indexBytesPerEntry is the B-tree memory one index entry takes besides
// the strings it shares with the object: the 32-byte entry in a node whose
// items slice is on average not full, plus the node's share of child
// pointers. Measured by BenchmarkIndexBytesPerEntry (57-58 B at 10k and
// 100k entries); the index metrics estimate with it.
const indexBytesPerEntry = 57

// indexOf is the position of field's index in the snapshot, -1 when the
// store does not index field.
func (s Snapshot) indexOf(field string) int {
	for i, f := range s.fields {
		if f == field {
			return i
		}
	}
	return -1
}

// rangeIndex calls fn, in key order, for every object of index i with
// value whose key has prefix and sorts after startKeyExclusive, until fn
// returns false. probe is scratch for the key-tree lookups (its Key is
// overwritten), so that a walk over many entries does not allocate one
// per item.
func (s Snapshot) rangeIndex(i int, value, prefix, startKeyExclusive string, probe *Object, fn func(*Object) bool) {
	if probe == nil {
		probe = &Object{}
	}
	s.index[i].AscendGreaterOrEqual(indexEntry{value: value, key: rangeStart(prefix, startKeyExclusive)}, func(e indexEntry) bool {
		if e.value != value || !strings.HasPrefix(e.key, prefix) {
			return false
		}
		probe.Key = e.key
		o, ok := s.tree.Get(probe)
		if !ok {
			// Unreachable: the index and the key tree of one state are
			// written together. Skipping keeps a reader alive if it
			// ever happened; the store's tests compare both.
			return true
		}
		return fn(o)
	})
}

// rangeValue is Range restricted to the objects whose field has value:
// through the field's index when the store keeps one, else by filtering
// the key range (a reader that asked for an index the store was not
// built with still gets the right objects, only slower).
func (s Snapshot) rangeValue(iv IndexValue, prefix, startKeyExclusive string, probe *Object, fn func(*Object) bool) {
	if s.tree == nil {
		return
	}
	if i := s.indexOf(iv.Field); i >= 0 {
		s.rangeIndex(i, iv.Value, prefix, startKeyExclusive, probe, fn)
		return
	}
	s.Range(prefix, startKeyExclusive, func(o *Object) bool {
		if indexValue(o, iv.Field) != iv.Value {
			return true
		}
		return fn(o)
	})
}

// lastWithValue is the greatest key with prefix whose field has the value.
func (s Snapshot) lastWithValue(iv IndexValue, prefix string) (string, bool) {
	if s.tree == nil {
		return "", false
	}
	i := s.indexOf(iv.Field)
	if i < 0 {
		var last string
		s.rangeValue(iv, prefix, "", nil, func(o *Object) bool { last = o.Key; return true })
		return last, last != ""
	}
	// The smallest entry above every entry of (value, prefix...).
	end := indexEntry{value: iv.Value + "\x00"}
	if prefix != "" {
		end = indexEntry{value: iv.Value, key: prefixEnd(prefix)}
	}
	var key string
	s.index[i].DescendLessOrEqual(end, func(e indexEntry) bool {
		if e == end {
			return true
		}
		if e.value == iv.Value && strings.HasPrefix(e.key, prefix) {
			key = e.key
		}
		return false
	})
	return key, key != ""
}

// hasAfter reports whether the snapshot holds a key with prefix after key
// (one B-tree descent).
func (s Snapshot) hasAfter(prefix, key string) bool {
	found := false
	s.Range(prefix, key, func(*Object) bool { found = true; return false })
	return found
}

// IndexStats are the numbers exported for one field index of a store, over
// all its shards, at the latest state.
type IndexStats struct {
	Field string
	// Entries is the number of objects indexed (every object is, under ""
	// when it has no value).
	Entries int
	// Values is the number of distinct values.
	Values int
	// Bytes estimates the index's memory: its B-tree nodes
	// (indexBytesPerEntry) plus the key and value bytes of its entries,
	// counted as if not shared with the objects. They are shared until an
	// object is updated with its value unchanged; once every object was,
	// the estimate is ~8% under the heap measured (allocation size
	// classes), before that it is over.
	Bytes int64
}

// IndexStats returns the stats of each of the store's field indexes. It
// walks every index (O(objects)), meant for a metrics tick, not a request.
func (s *Store) IndexStats() []IndexStats {
	snaps, _, err := s.snapshots(0)
	if err != nil || len(snaps) == 0 {
		return nil
	}
	out := make([]IndexStats, len(snaps[0].fields))
	for i, field := range snaps[0].fields {
		st := IndexStats{Field: field}
		// Each shard's distinct values in order, then a merge counting
		// the distinct ones over all shards (a value is in many shards).
		runs := make(valueRuns, 0, len(snaps))
		for _, sn := range snaps {
			var vals []string
			sn.index[i].Ascend(func(e indexEntry) bool {
				st.Entries++
				st.Bytes += int64(len(e.key) + len(e.value))
				if len(vals) == 0 || vals[len(vals)-1] != e.value {
					vals = append(vals, e.value)
				}
				return true
			})
			if len(vals) > 0 {
				runs = append(runs, vals)
			}
		}
		st.Values = runs.countDistinct()
		st.Bytes += int64(st.Entries) * indexBytesPerEntry
		out[i] = st
	}
	return out
}

// valueRuns are sorted runs of distinct values, merged by a min-heap of
// their heads.
type valueRuns [][]string

func (h valueRuns) Len() int           { return len(h) }
func (h valueRuns) Less(i, j int) bool { return h[i][0] < h[j][0] }
func (h valueRuns) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *valueRuns) Push(x any)        { *h = append(*h, x.([]string)) }
func (h *valueRuns) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

// countDistinct is the number of distinct values over all runs (it
// consumes them).
func (h *valueRuns) countDistinct() int {
	heap.Init(h)
	n := 0
	last, first := "", true
	for h.Len() > 0 {
		r := (*h)[0]
		if first || r[0] != last {
			n++
			last, first = r[0], false
		}
		if len(r) == 1 {
			heap.Pop(h)
		} else {
			(*h)[0] = r[1:]
			heap.Fix(h, 0)
		}
	}
	return n
}

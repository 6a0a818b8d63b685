package store

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/btree"
	"k8s.io/utils/clock"
)

// ShardOptions configures a Shard.
type ShardOptions struct {
	// HistoryWindow is how long a superseded state stays readable. A continue
	// token issued at time t for a state is honoured until at least
	// t+HistoryWindow, because a state is only dropped HistoryWindow after the
	// change that replaced it. Zero keeps only the current state.
	HistoryWindow time.Duration
	// MaxHistory caps the number of retained states regardless of the window,
	// bounding memory under a burst of writes. Zero means no cap.
	MaxHistory int
	// Clock defaults to the real clock; tests inject a fake one.
	Clock clock.PassiveClock
	// Indexes are the fields to keep an index of (see index.go).
	Indexes []string
}

// historyEntry is the shard's state from rv (the RV of the change that
// produced it) until the next entry's rv.
type historyEntry struct {
	rv   uint64
	tree *btree.BTreeG[*Object]
	// index holds the field indexes in the same state as tree.
	index []*indexTree
	// supersededAt is when the next entry replaced this one; zero for the
	// current state.
	supersededAt time.Time
	// knownUntil, when set, ends this state's validity before the next
	// entry: a relist replaced it, and the changes between knownUntil and
	// the relist's RV were never observed one by one.
	knownUntil uint64
}

// Shard is one hash shard of a resource: the objects whose key hashes to it
// and the resourceVersion up to which it has applied the upstream stream.
//
// All methods are safe for concurrent use. Writes (Apply, MarkProgress,
// Replace) are expected from one ingestion goroutine; reads take snapshots
// and never block writers for longer than a pointer copy.
type Shard struct {
	window     time.Duration
	maxHistory int
	clock      clock.PassiveClock

	mu sync.Mutex
	// tree is the writer's tree. It is never handed out: every published
	// state is a Clone, which google/btree allows to be read concurrently
	// with writes to the original.
	tree    *btree.BTreeG[*Object]
	applied uint64
	// fields are the indexed fields and index their writer trees, never
	// handed out either. published[i] is the clone of index[i] that the
	// last recorded state holds, nil once index[i] changed since: a state
	// recorded while an index is unchanged shares its clone instead of
	// cloning again.
	fields    []string
	index     []*indexTree
	published []*indexTree
	// history is ordered by rv; the last entry is the current state.
	history []historyEntry
	bytes   int64
	// counts of the writer's state (counts.go).
	counts counts
	// advanced is closed when applied moves, waking WaitForRV callers.
	// It is only replaced when someone waited on it, so ingestion does not
	// allocate a channel per event when nobody waits.
	advanced chan struct{}
	waited   bool
}

// NewShard returns an empty shard at resourceVersion 0.
func NewShard(opts ShardOptions) *Shard {
	c := opts.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	s := &Shard{
		window:     opts.HistoryWindow,
		maxHistory: opts.MaxHistory,
		clock:      c,
		tree:       newTree(),
		advanced:   make(chan struct{}),
		fields:     opts.Indexes,
		index:      make([]*indexTree, len(opts.Indexes)),
		published:  make([]*indexTree, len(opts.Indexes)),
		counts:     newCounts(len(opts.Indexes)),
	}
	for i := range s.index {
		s.index[i] = newIndexTree()
	}
	s.history = []historyEntry{{rv: 0, tree: s.tree.Clone(), index: s.publishIndexesLocked()}}
	return s
}

// AppliedRV is the resourceVersion up to which the shard reflects upstream.
func (s *Shard) AppliedRV() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// Apply applies one upstream change. Added and Modified both upsert (after a
// resumed watch the apiserver may re-send an object as ADDED); deleting an
// absent key only advances the resourceVersion.
func (s *Shard) Apply(ev Event) error {
	if ev.Object == nil {
		return fmt.Errorf("store: %s event at RV %d has no object", ev.Type, ev.RV)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.RV <= s.applied {
		return fmt.Errorf("%w: event %s %q at RV %d, applied %d", ErrStaleEvent, ev.Type, ev.Object.Key, ev.RV, s.applied)
	}
	switch ev.Type {
	case Added, Modified:
		old, had := s.tree.ReplaceOrInsert(ev.Object)
		if had {
			s.bytes -= int64(len(old.Raw))
		}
		s.bytes += int64(len(ev.Object.Raw))
		s.reindexLocked(old, ev.Object)
		s.counts.move(s.fields, old, ev.Object)
	case Deleted:
		old, had := s.tree.Delete(ev.Object)
		if !had {
			s.advanceLocked(ev.RV)
			return nil
		}
		s.bytes -= int64(len(old.Raw))
		s.reindexLocked(old, nil)
		s.counts.move(s.fields, old, nil)
	default:
		return fmt.Errorf("store: unknown event type %d", ev.Type)
	}
	s.recordLocked(ev.RV)
	s.advanceLocked(ev.RV)
	return nil
}

// MarkProgress records that upstream reached rv without changing this shard.
// Every shard sees every upstream RV, so this keeps the shard's watermark (and
// the consistent-read wait) moving even when its slice is quiet. Older or
// equal RVs are ignored: bookmarks may repeat.
func (s *Shard) MarkProgress(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv <= s.applied {
		return
	}
	s.advanceLocked(rv)
	s.pruneLocked()
}

// Replace swaps the whole content for objects (a relist after 410 Gone) at
// rv and returns the difference as events at rv, in key order: Deleted for
// vanished keys, Modified for changed objects, Added for new ones, so
// downstream watchers see a diff instead of being dropped.
//
// The changes between the old applied RV and rv were never observed one by
// one, so states in that gap cannot be reconstructed and read as expired;
// states up to the old applied RV stay readable, so continue tokens issued
// before a relist keep working for the rest of the history window.
func (s *Shard) Replace(objects []*Object, rv uint64) ([]Event, error) {
	sorted := make([]*Object, len(objects))
	copy(sorted, objects)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Key < sorted[j].Key })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Key == sorted[i-1].Key {
			return nil, fmt.Errorf("store: Replace got key %q twice", sorted[i].Key)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if rv < s.applied {
		return nil, fmt.Errorf("%w: replace at RV %d, applied %d", ErrStaleEvent, rv, s.applied)
	}
	// The first load: the empty tree NewShard starts with is no state of
	// upstream's, so it must not stay readable at the RVs before rv. It
	// did (its entry at RV 0 was open-ended), and a replica that had just
	// restarted answered a front's list at an RV below its load with
	// nothing: a watch-list through the front missed that shard's objects
	// and informers lost them.
	first := s.applied == 0

	var events []Event
	next := newTree()
	nextIndex := make([]*indexTree, len(s.fields))
	for i := range nextIndex {
		nextIndex[i] = newIndexTree()
	}
	var size int64
	nextCounts := newCounts(len(s.fields))
	i := 0
	s.tree.Ascend(func(old *Object) bool {
		for i < len(sorted) && sorted[i].Key < old.Key {
			events = append(events, Event{Type: Added, Object: sorted[i], RV: rv})
			i++
		}
		if i < len(sorted) && sorted[i].Key == old.Key {
			if changed(old, sorted[i]) {
				events = append(events, Event{Type: Modified, Object: sorted[i], RV: rv})
			}
			i++
		} else {
			events = append(events, Event{Type: Deleted, Object: old, RV: rv})
		}
		return true
	})
	for ; i < len(sorted); i++ {
		events = append(events, Event{Type: Added, Object: sorted[i], RV: rv})
	}
	if len(events) == 0 && !first {
		// Nothing changed between the applied RV and rv: the current state
		// is the state at every RV in between, so history stays continuous
		// (no gap) and nothing needs to be published.
		if rv > s.applied {
			s.advanceLocked(rv)
		}
		return nil, nil
	}
	for _, o := range sorted {
		next.ReplaceOrInsert(o)
		size += int64(len(o.Raw))
		nextCounts.move(s.fields, nil, o)
		for i, f := range s.fields {
			nextIndex[i].ReplaceOrInsert(indexEntry{value: indexValue(o, f), key: o.Key})
		}
	}

	s.tree = next
	s.bytes = size
	s.counts = nextCounts
	s.index = nextIndex
	clear(s.published)
	last := &s.history[len(s.history)-1]
	switch {
	case first:
		// Readable from rv on; earlier RVs are expired (Snapshot).
		s.history = []historyEntry{{rv: rv, tree: s.tree.Clone(), index: s.publishIndexesLocked()}}
	case last.rv == rv:
		last.tree = s.tree.Clone()
		last.index = s.publishIndexesLocked()
	default:
		last.knownUntil = s.applied
		s.recordLocked(rv)
	}
	if rv > s.applied {
		s.advanceLocked(rv)
	}
	return events, nil
}

func changed(old, cur *Object) bool {
	return old.RV != cur.RV || !bytes.Equal(old.Raw, cur.Raw)
}

// recordLocked publishes the writer tree as the state from rv on.
func (s *Shard) recordLocked(rv uint64) {
	now := s.clock.Now()
	s.history[len(s.history)-1].supersededAt = now
	s.history = append(s.history, historyEntry{rv: rv, tree: s.tree.Clone(), index: s.publishIndexesLocked()})
	s.pruneLocked()
}

// reindexLocked moves an object's entries in the field indexes from its
// old state (nil: it was absent) to cur (nil: deleted). A value that did
// not change leaves its index untouched.
func (s *Shard) reindexLocked(old, cur *Object) {
	for i, f := range s.fields {
		var ov, cv string
		if old != nil {
			ov = indexValue(old, f)
		}
		if cur != nil {
			cv = indexValue(cur, f)
		}
		if old != nil && cur != nil && ov == cv {
			continue
		}
		if old != nil {
			s.index[i].Delete(indexEntry{value: ov, key: old.Key})
		}
		if cur != nil {
			s.index[i].ReplaceOrInsert(indexEntry{value: cv, key: cur.Key})
		}
		s.published[i] = nil
	}
}

// publishIndexesLocked returns the index trees of a state being recorded:
// the last published clone of each unchanged index, a new clone of each
// changed one.
func (s *Shard) publishIndexesLocked() []*indexTree {
	if len(s.index) == 0 {
		return nil
	}
	out := make([]*indexTree, len(s.index))
	for i, t := range s.index {
		if s.published[i] == nil {
			s.published[i] = t.Clone()
		}
		out[i] = s.published[i]
	}
	return out
}

func (s *Shard) advanceLocked(rv uint64) {
	s.applied = rv
	if s.waited {
		close(s.advanced)
		s.advanced = make(chan struct{})
		s.waited = false
	}
}

// pruneLocked drops superseded states older than the window, and the oldest
// ones beyond MaxHistory. The current state is always kept.
func (s *Shard) pruneLocked() {
	drop := 0
	last := len(s.history) - 1
	if s.maxHistory > 0 && len(s.history) > s.maxHistory {
		drop = len(s.history) - s.maxHistory
	}
	now := s.clock.Now()
	for drop < last && now.Sub(s.history[drop].supersededAt) > s.window {
		drop++
	}
	if drop > last {
		drop = last
	}
	if drop > 0 {
		// Clear the dropped slots so their trees can be collected, then
		// shift; history is short-lived enough that copying is cheaper than
		// a ring buffer's bookkeeping.
		n := copy(s.history, s.history[drop:])
		clear(s.history[n:])
		s.history = s.history[:n]
	}
}

// WaitForRV blocks until the shard has applied rv or ctx is done, in which
// case it returns a *TooLargeResourceVersionError wrapping ctx.Err().
func (s *Shard) WaitForRV(ctx context.Context, rv uint64) error {
	for {
		s.mu.Lock()
		if s.applied >= rv {
			s.mu.Unlock()
			return nil
		}
		ch := s.advanced
		s.waited = true
		current := s.applied
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return tooLarge(ctx, rv, current)
		}
	}
}

// Latest returns the current state at the applied resourceVersion.
func (s *Shard) Latest() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.history[len(s.history)-1]
	return Snapshot{tree: h.tree, rv: s.applied, fields: s.fields, index: h.index}
}

// Snapshot returns the state exactly at rv: the last change at or before rv.
// It fails with *TooLargeResourceVersionError if rv has not been applied yet
// and with *ExpiredError if the history no longer holds that state.
func (s *Shard) Snapshot(rv uint64) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rv > s.applied {
		return Snapshot{}, &TooLargeResourceVersionError{RV: rv, Current: s.applied}
	}
	s.pruneLocked()
	// First entry that starts after rv; the one before it covers rv.
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].rv > rv })
	if i == 0 || (s.history[i-1].knownUntil != 0 && rv > s.history[i-1].knownUntil) {
		return Snapshot{}, &ExpiredError{RV: rv, Oldest: s.history[0].rv}
	}
	h := s.history[i-1]
	return Snapshot{tree: h.tree, rv: rv, fields: s.fields, index: h.index}, nil
}

// ShardStats are the numbers exported as metrics for one shard.
type ShardStats struct {
	Objects   int
	Bytes     int64
	AppliedRV uint64
	// Snapshots is the number of retained states (history depth).
	Snapshots int
	// OldestRV is the oldest resourceVersion still readable.
	OldestRV uint64
}

// Stats returns the shard's current numbers.
func (s *Shard) Stats() ShardStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ShardStats{
		Objects:   s.tree.Len(),
		Bytes:     s.bytes,
		AppliedRV: s.applied,
		Snapshots: len(s.history),
		OldestRV:  s.history[0].rv,
	}
}

package watch

import (
	"fmt"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Event is one change as the history keeps it.
type Event struct {
	Type store.EventType
	// Object is the new state; for Deleted, the last state.
	Object *store.Object
	// Prev is the state before the change (nil if the key was absent).
	Prev *store.Object
	RV   uint64
	// Received is when the hub got the event (delivery latency).
	Received time.Time
	// relistEnd marks the last event of a relist difference: watchers
	// that allow bookmarks get one at its RV afterwards, so a client that
	// resumes does so from the relist's RV.
	relistEnd bool
}

// gap is a range of RVs a relist skipped over: its changes were never seen
// one by one, so a watch cannot resume from inside it.
type gap struct{ from, to uint64 } // (from, to) exclusive

// history is the resource's recent events, shared by every watcher (the
// cacher's watchCacheHistory): numbered by sequence numbers that only grow,
// bounded by a time window and a count, searchable by RV for a watch that
// resumes. The hub's lock guards it.
type history struct {
	// events[i] has sequence number base+i.
	events []Event
	base   uint64
	// floor: every event with RV > floor is in events.
	floor uint64
	// lastRV is the newest RV published (events or progress).
	lastRV uint64
	gaps   []gap
}

// head is the sequence number the next event will get.
func (h *history) head() uint64 { return h.base + uint64(len(h.events)) }

// at is the event with sequence number seq (base <= seq < head).
func (h *history) at(seq uint64) *Event { return &h.events[seq-h.base] }

func (h *history) append(batch []Event) { h.events = append(h.events, batch...) }

// addGap records that a relist at rv skipped the RVs since lastRV.
func (h *history) addGap(rv uint64) {
	if rv > h.lastRV+1 {
		h.gaps = append(h.gaps, gap{from: h.lastRV, to: rv})
	}
}

// resume is the sequence number of the first event after rv, or the
// apiserver watch cache's 410 when the history cannot tell what happened
// after rv: it is older than the history, or inside a relist's gap.
func (h *history) resume(rv uint64) (uint64, error) {
	if rv < h.floor {
		return 0, expired(rv, h.floor)
	}
	for _, g := range h.gaps {
		if rv > g.from && rv < g.to {
			return 0, expired(rv, g.to)
		}
	}
	return h.base + uint64(sort.Search(len(h.events), func(i int) bool { return h.events[i].RV > rv })), nil
}

// expired is the apiserver watch cache's 410 for a watch from an RV older
// than the history (watch_cache_history.go GetIntervalLocked).
func expired(rv, floor uint64) error {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, floor))
}

// prune drops events older than window or beyond max, whole RVs at a time
// (a relist difference shares one RV), calling drop for each before it is
// forgotten. It costs O(dropped): the slice is cut at the front, not
// copied down (copying the whole history on every publish was O(history)
// per event); append reallocates once the front's capacity is used up.
func (h *history) prune(now time.Time, window time.Duration, max int, drop func(seq uint64, e *Event)) {
	n := 0
	if len(h.events) > max {
		n = len(h.events) - max
	}
	for n < len(h.events) && now.Sub(h.events[n].Received) > window {
		n++
	}
	if n == 0 {
		return
	}
	for n < len(h.events) && h.events[n].RV == h.events[n-1].RV {
		n++
	}
	h.floor = h.events[n-1].RV
	for i := range n {
		drop(h.base+uint64(i), &h.events[i])
	}
	clear(h.events[:n]) // the dropped objects are garbage now
	h.events = h.events[n:]
	h.base += uint64(n)
	for len(h.gaps) > 0 && h.gaps[0].to <= h.floor {
		h.gaps = h.gaps[1:]
	}
}

// reset forgets every event: nothing at or below rv (or lastRV, which
// never goes back) can be resumed from.
func (h *history) reset(rv uint64) {
	h.base = h.head()
	clear(h.events)
	h.events = h.events[:0]
	h.gaps = nil
	h.floor = max(rv, h.lastRV)
}

// relistBookmark is the RV of the relist that ended at the last event a
// watcher considered (seen is one past it), or 0 when that event ends no
// relist; ok is false when the event says nothing new (at or below
// minRV, or pruned).
func (h *history) relistBookmark(seen, minRV uint64) (rv uint64, ok bool) {
	if seen <= h.base || seen > h.head() {
		return 0, false
	}
	e := h.at(seen - 1)
	if e.RV <= minRV {
		return 0, false
	}
	if e.relistEnd {
		return e.RV, true
	}
	return 0, true
}

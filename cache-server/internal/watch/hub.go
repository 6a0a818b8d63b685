// Package watch fans one resource's ingested change stream out to many
// watchers, the way kube-apiserver's cacher does, with one structural
// difference: events are not copied into a channel per watcher. The hub keeps
// one shared, bounded history of recent events (pointers to the immutable
// stored objects) and every watcher is only a cursor into it.
//
// Why a shared history instead of per-watcher buffers or store snapshots:
//   - Publishing an event is O(1) under the ingester's apply gate (append and
//     wake), plus an O(watchers) integer comparison to find watchers that fell
//     too far behind; no watcher can slow delivery to another or to ingestion.
//   - A watcher's "buffer" is the distance between its cursor and the head.
//     It is bounded (Options.BufferSize): a watcher that falls further behind
//     is terminated and counted, as the cacher closes a watcher whose channel
//     is full. Memory per watcher is O(1) whatever the buffer size.
//   - Resuming a watch from resourceVersion X is a binary search in the same
//     history (the cacher's watchCache history plays this role); deriving
//     events from store snapshots would need a tree diff per resumption and
//     would lose the per-event previous state that selector transitions need.
//   - Watch-list reads its initial state from a store snapshot at the RV the
//     cursor starts from, so the snapshot and the live events join without a
//     gap or a duplicate, and initial streaming holds no lock: a slow
//     watch-list client delays nobody.
package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Defaults for Options.
const (
	// DefaultBufferSize is how many events (of the resource, before
	// filtering) a watcher may lag behind. The cacher's per-watcher channel
	// is 10 to 1000 events depending on the resource's event rate; we keep
	// the upper end because here a buffer slot costs nothing per watcher.
	DefaultBufferSize = 1000
	// DefaultMaxHistory caps the shared history regardless of its window.
	DefaultMaxHistory = 100000
	// DefaultBookmarkFrequency is the cacher's bookmarkFrequency.
	DefaultBookmarkFrequency = time.Minute
)

// Options configure a Hub.
type Options struct {
	// Resource is the metrics label.
	Resource string
	// Store is where watch-list initial events and previous object states
	// are read from: the resource's store (standalone, shard) or a fleet's
	// shards.
	Store Snapshots
	// Metrics may be nil (tests).
	Metrics *metrics.Metrics
	// BufferSize bounds how far (in events) a watcher may fall behind.
	BufferSize int
	// HistoryWindow is how long events stay available for resumption; the
	// tier uses the store's history window. MaxHistory caps the count.
	HistoryWindow time.Duration
	MaxHistory    int
	// PrevIncluded: published events carry their previous state (Prev),
	// so an event without one had none and the store is not asked. A
	// fleet's front sets it: its Store is the shards, over the network.
	PrevIncluded bool
	// BookmarkFrequency is how often a watcher that allows bookmarks gets
	// one when the resource's RV moved (also when its own slice did not).
	BookmarkFrequency time.Duration
	Clock             clock.Clock
	Log               logr.Logger
}

// Snapshots is what the hub reads from the resource's state.
type Snapshots interface {
	// Get returns key's object at snapshotRV (nil if absent); used for the
	// previous state of an event that does not carry it.
	Get(key string, snapshotRV uint64) (*store.Object, uint64, error)
	// Scan streams a watch-list's initial state (see store.Store.Scan).
	Scan(req store.ListRequest, fn func(*store.Object) bool) (uint64, error)
}

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

// Hub is the fan-out for one resource.
type Hub struct {
	opts Options
	clk  clock.Clock

	mu sync.RWMutex
	// events[i] has sequence number base+i; sequence numbers only grow.
	events []Event
	base   uint64
	// floor: every event with RV > floor is in events.
	floor  uint64
	lastRV uint64
	gaps   []gap
	notify chan struct{} // closed and replaced on every change of lastRV
	// watchers registered for live events.
	watchers map[*Watcher]struct{}
	closed   bool

	// published is lastRV readable without the lock (the publisher reads
	// it to look up previous states).
	published atomic.Uint64
	active    atomic.Int64
}

// New returns an empty hub; it learns the resource's RV from the first
// Relist or Progress call.
func New(opts Options) *Hub {
	if opts.BufferSize <= 0 {
		opts.BufferSize = DefaultBufferSize
	}
	if opts.MaxHistory <= 0 {
		opts.MaxHistory = DefaultMaxHistory
	}
	if opts.HistoryWindow <= 0 {
		opts.HistoryWindow = 150 * time.Second
	}
	if opts.BookmarkFrequency <= 0 {
		opts.BookmarkFrequency = DefaultBookmarkFrequency
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Hub{opts: opts, clk: opts.Clock, notify: make(chan struct{}), watchers: map[*Watcher]struct{}{}}
}

// LastRV is the newest RV the hub has published.
func (h *Hub) LastRV() uint64 { return h.published.Load() }

// Active is the number of registered watchers.
func (h *Hub) Active() int { return int(h.active.Load()) }

// Publish records events applied to the store one by one (upstream.Options
// OnEvents). It must be called in RV order, after the store applied them,
// and before any later change: the previous state of each object is read
// from the store's snapshot at the last published RV.
func (h *Hub) Publish(evs []store.Event) {
	h.publish(evs, 0, false)
}

// Relist records a relist at rv whose difference to the previous state is
// evs (upstream.Options OnRelist). The first relist is the initial load:
// it is not history, the history starts after it.
func (h *Hub) Relist(evs []store.Event, rv uint64) {
	h.publish(evs, rv, true)
}

// Progress records that upstream reached rv with no change to the resource
// (a bookmark); periodic bookmarks to watchers carry it.
func (h *Hub) Progress(rv uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if rv <= h.lastRV {
		return
	}
	if h.lastRV == 0 {
		h.floor = rv
	}
	h.advanceLocked(rv)
}

func (h *Hub) publish(evs []store.Event, relistRV uint64, relist bool) {
	prevRV := h.published.Load()
	now := h.clk.Now()
	batch := make([]Event, 0, len(evs))
	for _, ev := range evs {
		e := Event{Type: ev.Type, Object: ev.Object, RV: ev.RV, Received: now, Prev: ev.Prev}
		switch {
		case ev.Prev != nil:
			// Known to the producer (a fleet front's shard).
		case h.opts.PrevIncluded:
			// It had none (an ADDED).
		case prevRV > 0:
			if ev.Type == store.Deleted && relist {
				e.Prev = ev.Object
			} else if o, _, err := h.opts.Store.Get(ev.Object.Key, prevRV); err == nil {
				e.Prev = o
			} else {
				h.opts.Log.Error(err, "cannot read previous state; selector transitions of this event may be wrong", "resource", h.opts.Resource, "key", ev.Object.Key, "rv", prevRV)
			}
		}
		batch = append(batch, e)
	}
	if relist && len(batch) > 0 {
		batch[len(batch)-1].relistEnd = true
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	newRV := relistRV
	for _, e := range batch {
		newRV = max(newRV, e.RV)
	}
	if h.lastRV == 0 {
		// Initial load: nothing to resume from before it.
		h.floor = newRV
		h.advanceLocked(newRV)
		return
	}
	if relist && relistRV > h.lastRV+1 {
		h.gaps = append(h.gaps, gap{from: h.lastRV, to: relistRV})
	}
	h.events = append(h.events, batch...)
	h.pruneLocked(now)
	if newRV > h.lastRV {
		h.advanceLocked(newRV)
	} else {
		h.wakeLocked()
	}
	// Terminate watchers that fell too far behind. This is the only
	// per-watcher work done when publishing: an integer comparison.
	head := h.base + uint64(len(h.events))
	for w := range h.watchers {
		if !w.initializing.Load() && !w.req.NoLagLimit && head-w.cursor.Load() > uint64(h.opts.BufferSize) {
			h.terminateLocked(w, "slow")
		}
	}
}

func (h *Hub) advanceLocked(rv uint64) {
	h.lastRV = rv
	h.published.Store(rv)
	h.wakeLocked()
}

func (h *Hub) wakeLocked() {
	close(h.notify)
	h.notify = make(chan struct{})
}

// pruneLocked drops events older than the window or beyond MaxHistory,
// whole RVs at a time (a relist difference shares one RV), and terminates
// watchers whose cursor points into what was dropped.
func (h *Hub) pruneLocked(now time.Time) {
	drop := 0
	if len(h.events) > h.opts.MaxHistory {
		drop = len(h.events) - h.opts.MaxHistory
	}
	for drop < len(h.events) && now.Sub(h.events[drop].Received) > h.opts.HistoryWindow {
		drop++
	}
	if drop == 0 {
		return
	}
	// Extend to the end of the RV group.
	for drop < len(h.events) && h.events[drop].RV == h.events[drop-1].RV {
		drop++
	}
	h.floor = h.events[drop-1].RV
	n := copy(h.events, h.events[drop:])
	clear(h.events[n:])
	h.events = h.events[:n]
	h.base += uint64(drop)
	for len(h.gaps) > 0 && h.gaps[0].to <= h.floor {
		h.gaps = h.gaps[1:]
	}
	for w := range h.watchers {
		if w.cursor.Load() < h.base {
			h.terminateLocked(w, "slow")
		}
	}
}

func (h *Hub) terminateLocked(w *Watcher, reason string) {
	if _, ok := h.watchers[w]; !ok {
		return
	}
	delete(h.watchers, w)
	h.active.Add(-1)
	if h.opts.Metrics != nil {
		h.opts.Metrics.WatchersActive.WithLabelValues(h.opts.Resource).Dec()
		h.opts.Metrics.WatchersTerminated.WithLabelValues(h.opts.Resource, reason).Inc()
	}
	w.terminated.Store(true)
	close(w.done)
	if w.onTerminate != nil {
		go w.onTerminate()
	}
}

// ExpiredError is the apiserver watch cache's 410 for a watch from an RV
// older than the history (watch_cache_history.go GetIntervalLocked).
func expired(rv, floor uint64) error {
	return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", rv, floor))
}

// Request describes a watch.
type Request struct {
	// Namespace scopes the watch ("" = all namespaces / cluster-scoped).
	Namespace string
	// Match is the label/field selector; nil matches everything.
	Match func(*store.Object) bool
	// Selector is Match as text (store.ListRequest.Selector).
	Selector store.Selector
	// InitialEvents: start from a snapshot at the current RV (the caller
	// made sure the hub is fresh enough) and stream it first.
	InitialEvents bool
	// From is the RV to stream events after, when not InitialEvents. Zero
	// means "now" (the hub's current RV).
	From uint64
	// AllowBookmarks enables periodic bookmarks; Deadline (if set) gets a
	// bookmark two seconds before it, as the cacher does.
	AllowBookmarks bool
	Deadline       time.Time
	// OnTerminate is called (in its own goroutine) when the hub terminates
	// the watcher; it should unblock a write in progress.
	OnTerminate func()
	// NoLagLimit exempts the watcher from BufferSize: a fleet front's
	// follower (Follow) may fall behind by a whole relist difference and
	// catch up; the history window still bounds it (a cursor whose events
	// were pruned is terminated).
	NoLagLimit bool
}

// Watcher is one watch: a cursor into the hub's history.
type Watcher struct {
	hub   *Hub
	req   Request
	match func(*store.Object) bool

	// cursor is the sequence number of the next history event to look at.
	cursor       atomic.Uint64
	initializing atomic.Bool
	terminated   atomic.Bool
	done         chan struct{}
	onTerminate  func()

	// SnapshotRV is the RV of the initial state (InitialEvents), or for a
	// watch from "now" (From 0) the hub's RV it starts after.
	SnapshotRV uint64
	// minRV: events at or below it are not delivered (a watch from a
	// future RV).
	minRV                 uint64
	sentRV                uint64
	nextBookmark          time.Time
	pendingRelistBookmark uint64
}

// Watch registers a watcher. For InitialEvents the caller streams the
// initial state with Initial before calling Next. An RV older than the
// history returns the apiserver's 410 Expired status error.
func (h *Hub) Watch(req Request) (*Watcher, error) {
	w := &Watcher{hub: h, req: req, done: make(chan struct{}), onTerminate: req.OnTerminate}
	prefix := keyhash.NamespacePrefix(req.Namespace)
	w.match = func(o *store.Object) bool {
		if prefix != "" && !hasPrefix(o.Key, prefix) {
			return false
		}
		return req.Match == nil || req.Match(o)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, apierrors.NewServiceUnavailable("the tier is shutting down")
	}
	head := h.base + uint64(len(h.events))
	switch {
	case req.InitialEvents:
		w.SnapshotRV = h.lastRV
		w.sentRV = h.lastRV
		w.cursor.Store(head)
		w.initializing.Store(true)
	case req.From == 0:
		w.SnapshotRV = h.lastRV
		w.sentRV = h.lastRV
		w.cursor.Store(head)
	default:
		from := req.From
		if from < h.floor {
			return nil, expired(from, h.floor)
		}
		for _, g := range h.gaps {
			if from > g.from && from < g.to {
				return nil, expired(from, g.to)
			}
		}
		i := sort.Search(len(h.events), func(i int) bool { return h.events[i].RV > from })
		w.cursor.Store(h.base + uint64(i))
		w.minRV = from
		w.sentRV = min(from, h.lastRV)
	}
	w.nextBookmark = w.bookmarkTime(h.clk.Now())
	h.watchers[w] = struct{}{}
	h.active.Add(1)
	if h.opts.Metrics != nil {
		h.opts.Metrics.WatchersActive.WithLabelValues(h.opts.Resource).Inc()
	}
	return w, nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// Initial streams the initial state (a store snapshot at SnapshotRV,
// filtered) to fn in key order, without copying it.
func (w *Watcher) Initial(fn func(*store.Object) bool) error {
	prefix := w.req.Namespace
	_, err := w.hub.opts.Store.Scan(store.ListRequest{SnapshotRV: w.SnapshotRV, Namespace: prefix, Match: w.req.Match, Selector: w.req.Selector}, func(o *store.Object) bool {
		select {
		case <-w.done:
			return false
		default:
		}
		return fn(o)
	})
	if err != nil {
		return err
	}
	if w.terminated.Load() {
		return ErrTerminated
	}
	return nil
}

// InitialDone ends the initial phase: from now on the watcher's lag counts.
// If the history no longer holds the events after the snapshot, the watcher
// is terminated (the client re-watches).
func (w *Watcher) InitialDone() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	w.initializing.Store(false)
	if w.cursor.Load() < h.base {
		h.terminateLocked(w, "slow")
	}
}

// Stop unregisters the watcher.
func (w *Watcher) Stop() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.watchers[w]; ok {
		delete(h.watchers, w)
		h.active.Add(-1)
		if h.opts.Metrics != nil {
			h.opts.Metrics.WatchersActive.WithLabelValues(h.opts.Resource).Dec()
		}
		close(w.done)
	}
}

// ErrTerminated is returned by Next after the hub closed a watcher that
// could not keep up.
var ErrTerminated = errors.New("watcher terminated: it could not keep up with the event stream")

// Out is one event to send.
type Out struct {
	// Type is ADDED, MODIFIED, DELETED or BOOKMARK.
	Type string
	// Object is nil for a bookmark.
	Object *store.Object
	// RV is the event's resourceVersion; for a DELETED that the selector
	// produced (or a relist), Object's own RV is older and the encoder must
	// rewrite metadata.resourceVersion to RV, as the cacher does.
	RV uint64
	// RewriteRV: Object's metadata.resourceVersion must be set to RV.
	RewriteRV bool
	// Received is when the tier got the change (zero for bookmarks).
	Received time.Time
}

// maxBatch bounds how many history events Next looks at per call.
const maxBatch = 256

// Next appends the next events for this watcher to out and returns it. It
// blocks until there is at least one event or bookmark, stop is closed
// (returns out unchanged, nil), or the watcher is terminated (ErrTerminated).
func (w *Watcher) Next(stop <-chan struct{}, out []Out) ([]Out, error) {
	h := w.hub
	for {
		if w.terminated.Load() {
			return out, ErrTerminated
		}
		h.mu.RLock()
		notify := h.notify
		lastRV := h.lastRV
		head := h.base + uint64(len(h.events))
		cur := w.cursor.Load()
		if cur < h.base {
			h.mu.RUnlock()
			return out, ErrTerminated
		}
		lag := head - cur
		if lag > uint64(h.opts.BufferSize) && !w.initializing.Load() && !w.req.NoLagLimit {
			// Fell behind while initial events were being sent (the
			// publisher does not count those): same as a full buffer.
			h.mu.RUnlock()
			h.mu.Lock()
			h.terminateLocked(w, "slow")
			h.mu.Unlock()
			return out, ErrTerminated
		}
		n := 0
		for cur < head && n < maxBatch {
			e := &h.events[cur-h.base]
			cur++
			n++
			if e.RV <= w.minRV {
				continue
			}
			if o, ok := w.convert(e); ok {
				out = append(out, o)
				// Only what the client saw counts: a bookmark is due
				// when the resource moved past it, even if no event of
				// this watcher's slice did.
				w.sentRV = max(w.sentRV, e.RV)
			}
			if e.relistEnd {
				w.pendingRelistBookmark = e.RV
			} else if e.RV > w.pendingRelistBookmark {
				w.pendingRelistBookmark = 0
			}
		}
		h.mu.RUnlock()
		w.cursor.Store(cur)
		if h.opts.Metrics != nil && n > 0 {
			h.opts.Metrics.WatchBufferFill.WithLabelValues(h.opts.Resource).Observe(float64(lag) / float64(h.opts.BufferSize))
		}
		if w.req.AllowBookmarks && w.pendingRelistBookmark != 0 && cur == head {
			out = append(out, Out{Type: "BOOKMARK", RV: w.pendingRelistBookmark})
			w.pendingRelistBookmark = 0
		}
		now := h.clk.Now()
		if w.req.AllowBookmarks && cur == head && !now.Before(w.nextBookmark) {
			w.nextBookmark = w.bookmarkTime(now)
			if lastRV > w.sentRV && lastRV > w.minRV {
				// Every event up to lastRV has been looked at (cur ==
				// head was read under the same lock), so the bookmark
				// is a true watermark even if nothing matched.
				out = append(out, Out{Type: "BOOKMARK", RV: lastRV})
				w.sentRV = lastRV
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if cur < head {
			continue
		}
		var timer clock.Timer
		var timerC <-chan time.Time
		if w.req.AllowBookmarks && !w.nextBookmark.IsZero() {
			timer = h.clk.NewTimer(w.nextBookmark.Sub(now))
			timerC = timer.C()
		}
		stopped := false
		select {
		case <-notify:
		case <-timerC:
		case <-w.done:
			// Terminated: reported at the top of the loop. Stopped by
			// its owner: nothing more will come.
			stopped = !w.terminated.Load()
		case <-stop:
			stopped = true
		}
		if timer != nil {
			timer.Stop()
		}
		if stopped {
			return out, nil
		}
	}
}

// bookmarkTime is the cacher's nextBookmarkTime: every BookmarkFrequency,
// and two seconds before the watch's deadline.
func (w *Watcher) bookmarkTime(now time.Time) time.Time {
	t := now.Add(w.hub.opts.BookmarkFrequency)
	if !w.req.Deadline.IsZero() {
		if pre := w.req.Deadline.Add(-2 * time.Second); pre.Before(t) {
			t = pre
		}
		if t.Before(now) {
			return time.Time{} // too close to the deadline: no more
		}
	}
	return t
}

// convert is the cacher's convertToWatchEvent: the event as this watcher
// sees it through its selector.
func (w *Watcher) convert(e *Event) (Out, bool) {
	cur := e.Type != store.Deleted && w.match(e.Object)
	var old bool
	prev := e.Prev
	if e.Type == store.Deleted && prev == nil {
		prev = e.Object
	}
	if prev != nil {
		old = w.match(prev)
	}
	switch {
	case cur && !old:
		return Out{Type: "ADDED", Object: e.Object, RV: e.RV, Received: e.Received}, true
	case cur && old:
		return Out{Type: "MODIFIED", Object: e.Object, RV: e.RV, Received: e.Received}, true
	case !cur && old:
		o := e.Object
		if e.Type != store.Deleted || o == nil {
			o = prev
		}
		return Out{Type: "DELETED", Object: o, RV: e.RV, RewriteRV: o.RV != e.RV, Received: e.Received}, true
	}
	return Out{}, false
}

// WithResourceVersion returns raw (a JSON object) with metadata.resourceVersion
// set to rv, for DELETED events whose object is a previous state.
func WithResourceVersion(raw []byte, rv uint64) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		obj["metadata"] = md
	}
	md["resourceVersion"] = strconv.FormatUint(rv, 10)
	return json.Marshal(obj)
}

// WaitFor blocks until the hub has published rv (the ingester applied it
// and is about to publish it under its gate) or ctx ends.
func (h *Hub) WaitFor(ctx context.Context, rv uint64) error {
	for {
		h.mu.RLock()
		last, notify := h.lastRV, h.notify
		h.mu.RUnlock()
		if last >= rv {
			return nil
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return &store.TooLargeResourceVersionError{RV: rv, Current: last, Err: ctx.Err()}
		}
	}
}

// Reset forgets the history and starts it again at rv: every watcher is
// closed (counted with reason) and re-watches; one resuming from below rv
// gets 410 and relists. A fleet's front calls it when changes of a shard
// were lost (the shard restarted). The hub's RV never goes back.
func (h *Hub) Reset(rv uint64, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers {
		h.terminateLocked(w, reason)
	}
	h.base += uint64(len(h.events))
	clear(h.events)
	h.events = h.events[:0]
	h.gaps = nil
	h.floor = max(rv, h.lastRV)
	if rv > h.lastRV {
		h.advanceLocked(rv)
	} else {
		h.wakeLocked()
	}
}

// Close terminates every watcher (the server is shutting down: clients
// re-watch elsewhere, as the apiserver ends watches on shutdown) and
// refuses new ones.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for w := range h.watchers {
		h.terminateLocked(w, "shutdown")
	}
}

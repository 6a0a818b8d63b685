package watch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Defaults for Options.
const (
	// DefaultBufferSize is how many events (of those that can reach it) a
	// watcher may lag behind. The cacher's per-watcher channel is 10 to
	// 1000 events depending on the resource's event rate and on whether
	// the watcher is indexed; we keep the upper end because here a buffer
	// slot costs nothing per watcher.
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
	// FieldIndexes are the fields whose values index watchers
	// (catalog.Entry.FieldIndexes): a watcher whose Request.Index names
	// one of them reads only its value's events.
	FieldIndexes []string
	// Metrics may be nil (tests).
	Metrics *metrics.Metrics
	// BufferSize bounds how far (in events that can reach it) a watcher
	// may fall behind.
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

// Hub is the fan-out for one resource: the history, the index that says
// which watchers an event reaches, and the watchers.
type Hub struct {
	opts Options
	clk  clock.Clock

	mu   sync.RWMutex
	hist history
	idx  index
	// notify wakes unindexed watchers, followers and WaitFor on every
	// change of the history or of lastRV.
	notify wakeup
	closed bool

	// published is lastRV readable without the lock (the publisher reads
	// it to look up previous states).
	published atomic.Uint64
	active    atomic.Int64
	m         hubMetrics
}

// hubMetrics are the hub's metric children, resolved once: publish
// observes one per event under the hub's lock.
type hubMetrics struct {
	active, indexed, unindexed, values prometheus.Gauge
	candidates                         prometheus.Observer
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
	h := &Hub{opts: opts, clk: opts.Clock, idx: newIndex(opts.FieldIndexes)}
	if m := opts.Metrics; m != nil {
		r := opts.Resource
		h.m = hubMetrics{
			active:     m.WatchersActive.WithLabelValues(r),
			indexed:    m.WatchDispatchWatchers.WithLabelValues(r, "indexed"),
			unindexed:  m.WatchDispatchWatchers.WithLabelValues(r, "unindexed"),
			values:     m.WatchIndexValues.WithLabelValues(r),
			candidates: m.WatchDispatchCandidates.WithLabelValues(r),
		}
	}
	return h
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
	if rv <= h.hist.lastRV {
		return
	}
	if h.hist.lastRV == 0 {
		h.hist.floor = rv
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
	if h.hist.lastRV == 0 {
		// Initial load: nothing to resume from before it.
		h.hist.floor = newRV
		h.advanceLocked(newRV)
		return
	}
	if relist {
		h.hist.addGap(relistRV)
	}
	seq := h.hist.head()
	h.hist.append(batch)
	h.idx.beginBatch()
	for i := range batch {
		n := h.idx.add(seq+uint64(i), h.hist.at(seq+uint64(i)))
		if h.m.candidates != nil {
			h.m.candidates.Observe(float64(n))
		}
	}
	h.hist.prune(now, h.opts.HistoryWindow, h.opts.MaxHistory, h.idx.drop)
	if newRV > h.hist.lastRV {
		h.advanceLocked(newRV)
	} else {
		h.notify.signal()
	}
	h.idx.wakeTouched()
	if relist && len(batch) > 0 {
		// Indexed watchers whose value the difference did not touch get
		// its bookmark too (a relist is rare: waking all is fine).
		h.idx.eachWatched(func(p *posting) { p.wake.signal() })
	}
	h.terminateBehindLocked()
}

// terminateBehindLocked closes the watchers the batch left too far behind
// or whose unread events it pruned. It looks only at the watchers the
// batch reached — those of the postings it added to or pruned from, and
// the unindexed ones — so publishing stays O(1 + watchers reached).
func (h *Hub) terminateBehindLocked() {
	check := func(ws watcherSet) {
		// Backwards: terminating swaps the last watcher into the slot.
		for i := len(ws) - 1; i >= 0; i-- {
			if ws[i].behindLocked() {
				h.terminateLocked(ws[i], "slow")
			}
		}
	}
	for _, p := range h.idx.touched {
		check(p.watchers)
	}
	check(h.idx.unindexed)
}

func (h *Hub) advanceLocked(rv uint64) {
	h.hist.lastRV = rv
	h.published.Store(rv)
	h.notify.signal()
}

// unregisterLocked removes w from the hub; false if it was not there.
func (h *Hub) unregisterLocked(w *Watcher) bool {
	if !w.registered {
		return false
	}
	w.registered = false
	h.idx.unregister(w)
	h.active.Add(-1)
	h.gaugesLocked(w, -1)
	return true
}

// gaugesLocked moves the watcher gauges by delta for w.
func (h *Hub) gaugesLocked(w *Watcher, delta float64) {
	if h.m.active == nil {
		return
	}
	h.m.active.Add(delta)
	if w.post != nil {
		h.m.indexed.Add(delta)
	} else {
		h.m.unindexed.Add(delta)
	}
	h.m.values.Set(float64(h.idx.watchedValues))
}

func (h *Hub) terminateLocked(w *Watcher, reason string) {
	if !h.unregisterLocked(w) {
		return
	}
	if h.opts.Metrics != nil {
		h.opts.Metrics.WatchersTerminated.WithLabelValues(h.opts.Resource, reason).Inc()
	}
	w.terminated.Store(true)
	close(w.done)
	if w.onTerminate != nil {
		go w.onTerminate()
	}
}

// terminateAllLocked closes every watcher (Reset, Close).
func (h *Hub) terminateAllLocked(reason string) {
	all := append([]*Watcher(nil), h.idx.unindexed...)
	h.idx.eachWatched(func(p *posting) { all = append(all, p.watchers...) })
	for _, w := range all {
		h.terminateLocked(w, reason)
	}
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
	// from is the history sequence number of the first event to read.
	from := h.hist.head()
	switch {
	case req.InitialEvents:
		w.SnapshotRV = h.hist.lastRV
		w.sentRV = h.hist.lastRV
		w.initializing.Store(true)
	case req.From == 0:
		w.SnapshotRV = h.hist.lastRV
		w.sentRV = h.hist.lastRV
	default:
		var err error
		if from, err = h.hist.resume(req.From); err != nil {
			return nil, err
		}
		w.minRV = req.From
		w.sentRV = min(req.From, h.hist.lastRV)
	}
	w.seen = from
	w.cursor.Store(from)
	if w.post = h.idx.lookup(req.Index); w.post != nil {
		w.cursor.Store(w.post.entryAt(from))
	}
	w.nextBookmark = w.bookmarkTime(h.clk.Now())
	w.registered = true
	h.idx.register(w)
	h.active.Add(1)
	h.gaugesLocked(w, 1)
	return w, nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// WaitFor blocks until the hub has published rv (the ingester applied it
// and is about to publish it under its gate) or ctx ends.
func (h *Hub) WaitFor(ctx context.Context, rv uint64) error {
	for {
		h.mu.RLock()
		last, notify := h.hist.lastRV, h.notify.wait()
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
	h.terminateAllLocked(reason)
	h.hist.reset(rv)
	h.idx.reset()
	if rv > h.hist.lastRV {
		h.advanceLocked(rv)
	} else {
		h.notify.signal()
	}
}

// Close terminates every watcher (the server is shutting down: clients
// re-watch elsewhere, as the apiserver ends watches on shutdown) and
// refuses new ones.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.terminateAllLocked("shutdown")
}

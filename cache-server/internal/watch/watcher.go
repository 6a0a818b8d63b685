package watch

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Request describes a watch.
type Request struct {
	// Namespace scopes the watch ("" = all namespaces / cluster-scoped).
	Namespace string
	// Match is the label/field selector; nil matches everything.
	Match func(*store.Object) bool
	// Selector is Match as text (store.ListRequest.Selector).
	Selector store.Selector
	// BulkNice is passed to the initial events' read
	// (store.ListRequest.BulkNice).
	BulkNice int
	// Index is an equality on an indexed field that Match requires
	// (listparams.Request.IndexValue); Field "" is none. The watcher then
	// reads only the events whose old or new object has the value. A
	// field the hub does not index (Options.FieldIndexes) is ignored.
	Index store.IndexValue
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

// Watcher is one watch (the cacher's cacheWatcher): a cursor into what
// reaches it — the history, or for an indexed watcher its value's posting
// list — turned into the client's events through its selector.
type Watcher struct {
	hub   *Hub
	req   Request
	match func(*store.Object) bool

	// post is the posting list an indexed watcher reads; nil: the history.
	post *posting
	// slot is the watcher's place in its watcherSet; registered says it
	// is in one (both under the hub's lock).
	slot       int
	registered bool

	// cursor is the next entry to read: a history sequence number, or for
	// an indexed watcher an entry of its posting. Written by the watcher's
	// reader, read by the publisher for the lag check.
	cursor       atomic.Uint64
	initializing atomic.Bool
	terminated   atomic.Bool
	done         chan struct{}
	onTerminate  func()
	// wakeups counts the times Next was woken by a change (tests check
	// that other values' events do not wake an indexed watcher).
	wakeups atomic.Int64

	// SnapshotRV is the RV of the initial state (InitialEvents), or for a
	// watch from "now" (From 0) the hub's RV it starts after.
	SnapshotRV uint64
	// The fields below belong to the watcher's reader (Next, Follow).
	//
	// minRV: events at or below it are not delivered (a watch from a
	// future RV).
	minRV  uint64
	sentRV uint64
	// seen is one past the history sequence number of the last event
	// considered: every event before it was looked at or could not reach
	// the watcher.
	seen                  uint64
	nextBookmark          time.Time
	pendingRelistBookmark uint64
}

// The bounds of what the watcher reads, under the hub's lock.

func (w *Watcher) firstLocked() uint64 {
	if w.post != nil {
		return w.post.first()
	}
	return w.hub.hist.base
}

func (w *Watcher) endLocked() uint64 {
	if w.post != nil {
		return w.post.head()
	}
	return w.hub.hist.head()
}

func (w *Watcher) seqLocked(entry uint64) uint64 {
	if w.post != nil {
		return w.post.seq(entry)
	}
	return entry
}

// wakeLocked is the channel closed at the next change that can reach the
// watcher.
func (w *Watcher) wakeLocked() <-chan struct{} {
	if w.post != nil {
		return w.post.wake.wait()
	}
	return w.hub.notify.wait()
}

// behindLocked says the watcher must be terminated as too slow: what it
// has not read yet was pruned, or it is more than BufferSize events (of
// those that reach it) behind — counted only after its initial events.
func (w *Watcher) behindLocked() bool {
	cur := w.cursor.Load()
	if cur < w.firstLocked() {
		return true
	}
	return !w.initializing.Load() && !w.req.NoLagLimit && w.endLocked()-cur > uint64(w.hub.opts.BufferSize)
}

// Initial streams the initial state (a store snapshot at SnapshotRV,
// filtered) to fn in key order, without copying it.
func (w *Watcher) Initial(fn func(*store.Object) bool) error {
	return w.initial(false, fn)
}

// InitialRaw is Initial for a caller that needs each object's bytes (and
// content hash, store.Object.ContentHash) only during the call (a fleet's
// front writing them to a stream): the hub's store may then hand them out
// without copying them (store.ListRequest.Transient).
func (w *Watcher) InitialRaw(fn func(raw []byte, contentHash uint64) bool) error {
	return w.initial(true, func(o *store.Object) bool { return fn(o.Raw, o.ContentHash) })
}

func (w *Watcher) initial(transient bool, fn func(*store.Object) bool) error {
	req := store.ListRequest{SnapshotRV: w.SnapshotRV, Namespace: w.req.Namespace, Match: w.req.Match, Selector: w.req.Selector, Transient: transient, BulkNice: w.req.BulkNice}
	if w.post != nil {
		// Only an index the hub keeps: the store indexes the same
		// fields (catalog.Entry.FieldIndexes).
		req.Index = w.req.Index
	}
	_, err := w.hub.opts.Store.Scan(req, func(o *store.Object) bool {
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
	if w.cursor.Load() < w.firstLocked() {
		h.terminateLocked(w, "slow")
	}
}

// Stop unregisters the watcher.
func (w *Watcher) Stop() {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.unregisterLocked(w) {
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

// maxBatch bounds how many entries Next looks at per call.
const maxBatch = 256

// Next appends the next events for this watcher to out and returns it. It
// blocks until there is at least one event or bookmark, stop is closed
// (returns out unchanged, nil), or the watcher is terminated (ErrTerminated).
func (w *Watcher) Next(stop <-chan struct{}, out []Out) ([]Out, error) {
	h := w.hub
	for {
		h.mu.RLock()
		if w.terminated.Load() {
			h.mu.RUnlock()
			return out, ErrTerminated
		}
		wake := w.wakeLocked()
		lastRV := h.hist.lastRV
		end := w.endLocked()
		cur := w.cursor.Load()
		lag := end - cur
		if w.behindLocked() {
			// Fell behind while initial events were being sent (the
			// publisher does not count those): same as a full buffer.
			h.mu.RUnlock()
			h.mu.Lock()
			h.terminateLocked(w, "slow")
			h.mu.Unlock()
			return out, ErrTerminated
		}
		n := 0
		seen := w.seen
		for cur < end && n < maxBatch {
			seq := w.seqLocked(cur)
			e := h.hist.at(seq)
			cur++
			n++
			seen = seq + 1
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
		}
		caughtUp := cur == end
		if caughtUp {
			// What is not in the posting list cannot reach the watcher:
			// every event in the history has been considered.
			seen = h.hist.head()
		}
		if seen != w.seen {
			if rv, ok := h.hist.relistBookmark(seen, w.minRV); ok {
				w.pendingRelistBookmark = rv
			}
			w.seen = seen
		}
		h.mu.RUnlock()
		w.cursor.Store(cur)
		if h.opts.Metrics != nil && n > 0 {
			h.opts.Metrics.WatchBufferFill.WithLabelValues(h.opts.Resource).Observe(float64(lag) / float64(h.opts.BufferSize))
		}
		if w.req.AllowBookmarks && w.pendingRelistBookmark != 0 && caughtUp {
			out = append(out, Out{Type: "BOOKMARK", RV: w.pendingRelistBookmark})
			w.pendingRelistBookmark = 0
		}
		now := h.clk.Now()
		if w.req.AllowBookmarks && caughtUp && !now.Before(w.nextBookmark) {
			w.nextBookmark = w.bookmarkTime(now)
			if lastRV > w.sentRV && lastRV > w.minRV {
				// Every event up to lastRV has been considered (caughtUp
				// was read under the same lock), so the bookmark is a
				// true watermark even if nothing matched.
				out = append(out, Out{Type: "BOOKMARK", RV: lastRV})
				w.sentRV = lastRV
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		if !caughtUp {
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
		case <-wake:
			w.wakeups.Add(1)
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

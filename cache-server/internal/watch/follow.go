package watch

import (
	"errors"
	"time"
)

// Follow is Next for a consumer that wants the history itself rather than a
// client's view of it: every event after the watcher's position, unfiltered
// and with its previous state, and a watermark — the hub's RV, returned
// once every event up to it has been returned, also when none of them was
// new. A fleet's shard serves its front this way: the front merges shards'
// streams in RV order and may only pass an event on once every shard's
// watermark reached it.
//
// It blocks until there is an event or the watermark moved past what it
// last returned, stop is closed (returns out unchanged, 0, nil), or the
// watcher is terminated (ErrTerminated: it fell BufferSize events behind).
// The watcher must have been registered without InitialEvents and Index.
func (w *Watcher) Follow(stop <-chan struct{}, out []Event) ([]Event, uint64, error) {
	if w.post != nil {
		return out, 0, errors.New("watch: Follow reads the whole history; the watcher was registered with an Index")
	}
	h := w.hub
	for {
		h.mu.RLock()
		if w.terminated.Load() {
			h.mu.RUnlock()
			return out, 0, ErrTerminated
		}
		notify := h.notify.wait()
		lastRV := h.hist.lastRV
		head := h.hist.head()
		cur := w.cursor.Load()
		if cur < h.hist.base {
			h.mu.RUnlock()
			return out, 0, ErrTerminated
		}
		lag := head - cur
		n := 0
		for cur < head && n < maxBatch {
			e := h.hist.at(cur)
			cur++
			n++
			if e.RV > w.minRV {
				out = append(out, *e)
			}
		}
		h.mu.RUnlock()
		w.cursor.Store(cur)
		if h.opts.Metrics != nil && n > 0 {
			h.opts.Metrics.WatchBufferFill.WithLabelValues(h.opts.Resource).Observe(float64(lag) / float64(h.opts.BufferSize))
		}
		var watermark uint64
		if cur == head && lastRV > w.sentRV {
			watermark = lastRV
			w.sentRV = lastRV
		}
		if len(out) > 0 || watermark > 0 {
			return out, watermark, nil
		}
		if cur < head {
			continue
		}
		select {
		case <-notify:
		case <-w.done:
			if !w.terminated.Load() {
				return out, 0, nil // stopped by its owner
			}
		case <-stop:
			return out, 0, nil
		}
	}
}

// FollowPause is how long a shard may hold a watermark back to send it with
// the next events instead (see Follow): every upstream RV moves every
// shard's watermark, and one message per RV per front would cost more than
// the events themselves on a busy resource.
const FollowPause = 5 * time.Millisecond

package fleet

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Run follows every shard's change stream and feeds the hub until ctx ends.
//
// Every shard sees every upstream RV, so each stream's watermark says "you
// have all my changes up to here" even when the shard's slice did not
// change. An event is published once every shard's watermark reached its
// RV; events are published in RV order, so the front's watchers see the
// same sequence as a single cache would, and a watcher's last RV is a valid
// point to resume from.
//
// The streams start wherever each shard is; the hub starts at the highest
// of those starting points (earlier changes from the others are dropped),
// once every stream reached it.
func (s *Source) Run(ctx context.Context) {
	for i := range s.client.topo.Shards {
		go s.follow(ctx, i)
	}
	<-ctx.Done()
	s.hub.Close()
}

func (s *Source) follow(ctx context.Context, i int) {
	shard := s.client.topo.Shards[i].Name
	// Both series exist from the start at 0: a dashboard or alert sees
	// "no restarts", not "no data", on a healthy front.
	for _, reason := range []string{"error", "expired"} {
		s.metrics.FleetStreamRestarts.WithLabelValues(s.label, shard, reason)
	}
	backoff := 100 * time.Millisecond
	var from uint64 // 0: from now (the stream starts with its watermark)
	for ctx.Err() == nil {
		err := s.stream(ctx, i, from, func() { backoff = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return
		}
		reason := "error"
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			// The shard no longer has the changes after our watermark
			// (it restarted, or we were away longer than its history):
			// start over from now. What happened in between is lost to
			// the hub, so its watchers are closed and re-watch (or
			// relist if their RV is older than the restart point).
			reason = "expired"
			from = 0
		} else {
			s.mu.Lock()
			from = s.wm[i]
			// The shard resends everything after from: what was queued
			// above it (part of an RV's group) would be duplicated.
			s.queues[i] = keepThrough(s.queues[i], from)
			s.mu.Unlock()
		}
		s.metrics.FleetStreamRestarts.WithLabelValues(s.label, shard, reason).Inc()
		s.log.Info("shard change stream ended; reopening", "resource", s.label, "shard", shard, "from", from, "reason", reason, "err", errString(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// maxQueued bounds the events held for a shard while another shard's
// watermark lags (the watch hub's own history bound): past it the stream is
// not read until the queue drains, and the shard keeps the history (or, past
// its window, ends the stream, and the front starts over from now).
const maxQueued = 100_000

// stream reads one change stream until it fails; started is called once
// the stream delivered its first record.
func (s *Source) stream(ctx context.Context, i int, from uint64, started func()) error {
	q := s.query()
	if from > 0 {
		q.Set("rv", strconv.FormatUint(from, 10))
	}
	st, err := s.client.open(ctx, i, shardwire.PathWatch, q)
	if err != nil {
		return err
	}
	defer st.Close()
	s.setStreaming(i, st.endpoint)
	defer s.setStreaming(i, "")
	first := from == 0
	for n := 0; ; n++ {
		rec, err := st.Next()
		if err != nil {
			return s.client.readError(i, err)
		}
		if n == 0 {
			started()
		}
		for s.queued(i) > maxQueued {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		switch rec.Kind {
		case shardwire.KindWatermark:
			s.uncached.Store(rec.Header.Uncached)
			if rec.Header.Sizes != nil {
				s.setSizes(i, *rec.Header.Sizes, time.Duration(rec.Header.SeatCPU))
			}
			if first {
				s.restart(i, rec.Header.RV)
				first = false
				continue
			}
			s.advance(i, rec.Header.RV, nil)
		case shardwire.KindEvent:
			t, ok := eventTypes[rec.Header.Type]
			if !ok {
				return s.client.readError(i, errors.New("unknown event type "+strconv.Quote(rec.Header.Type)))
			}
			s.advance(i, rec.Header.RV, &store.Event{Type: t, Object: rec.Object, Prev: rec.Prev, RV: rec.Header.RV})
		case shardwire.KindError:
			return rec.Header.Error.Err()
		default:
			return s.client.readError(i, errors.New("unexpected record in a change stream"))
		}
	}
}

var eventTypes = map[string]store.EventType{"ADDED": store.Added, "MODIFIED": store.Modified, "DELETED": store.Deleted}

// restart records where shard i's stream (re)starts from now.
func (s *Source) restart(i int, rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[i] = nil
	if !s.started {
		s.starts[i] = rv
		s.wm[i] = rv
		for _, st := range s.starts {
			if st == 0 {
				return // not every stream has started yet
			}
		}
		s.started = true
		start := s.starts[0]
		for _, st := range s.starts {
			start = max(start, st)
		}
		// Changes at or below the start were not delivered by every
		// stream (a stream started later skipped its own): drop them.
		for k := range s.queues {
			s.queues[k] = dropThrough(s.queues[k], start)
		}
		s.hub.Progress(start)
		s.flushLocked()
		close(s.synced)
		s.log.Info("fleet streams started", "resource", s.label, "rv", start)
		return
	}
	// A restart after the hub started: the shard's changes between its
	// old watermark and rv never reached us, so the hub's history cannot
	// be trusted across them.
	s.wm[i] = rv
	floor := max(rv, s.hub.LastRV())
	s.hub.Reset(floor, "shard_restart")
	for k := range s.queues {
		s.queues[k] = dropThrough(s.queues[k], floor)
	}
	s.log.Info("shard stream restarted from now; watchers closed", "resource", s.label, "shard", s.client.topo.Shards[i].Name, "rv", floor)
	s.flushLocked()
}

func (s *Source) setStreaming(i int, endpoint string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streaming[i] = endpoint
}

func (s *Source) streamingFrom(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streaming[i]
}

func (s *Source) queued(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queues[i])
}

// keepThrough is evs up to and including rv.
func keepThrough(evs []store.Event, rv uint64) []store.Event {
	i := sort.Search(len(evs), func(i int) bool { return evs[i].RV > rv })
	return evs[:i]
}

func dropThrough(evs []store.Event, rv uint64) []store.Event {
	i := sort.Search(len(evs), func(i int) bool { return evs[i].RV > rv })
	return evs[i:]
}

// advance records shard i's progress (and an event) and publishes what
// every shard has reached.
//
// After an event at rv the shard's watermark is rv-1: other events at rv
// (a relist difference shares one RV) may follow, and only the watermark
// record the shard sends once it is caught up says rv is complete.
func (s *Source) advance(i int, rv uint64, ev *store.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev == nil {
		s.wm[i] = max(s.wm[i], rv)
	} else {
		s.addEventLocked(i, rv, *ev)
	}
	s.metrics.FleetWatermark.WithLabelValues(s.label, s.client.topo.Shards[i].Name).Set(float64(s.wm[i]))
	if s.started {
		s.flushLocked()
	}
}

func (s *Source) addEventLocked(i int, rv uint64, ev store.Event) {
	switch {
	case rv > s.wm[i]:
		// A change the stream had not covered yet. At or below the
		// hub's RV it predates the hub's start or last reset (a stream
		// that started lower than the others): the hub already claims
		// everything up to there.
		if !s.started || rv > s.hub.LastRV() {
			s.queues[i] = append(s.queues[i], ev)
		}
		s.wm[i] = max(s.wm[i], rv-1)
	case !s.started:
		// Before the hub starts nothing at an old RV is of interest.
	case rv < s.hub.LastRV():
		// Cannot be placed in RV order (and the protocol does not send
		// it: see below, the shard's RV is never below the hub's).
		s.log.V(1).Info("dropping an event below the merged RV", "resource", s.label, "shard", s.client.topo.Shards[i].Name, "rv", rv, "mergedRV", s.hub.LastRV())
	case rv == s.hub.LastRV():
		// At an RV the stream had already covered: a difference the shard
		// published at its current RV without a new upstream change (a
		// namespace entering or leaving the profile's namespaceSelector),
		// as standalone's hub does. Pass it on the same way: now.
		s.hub.Publish([]store.Event{ev})
	default:
		// Covered by this stream but not yet by every other: wait in
		// order with this shard's other changes.
		q := s.queues[i]
		k := sort.Search(len(q), func(j int) bool { return q[j].RV > rv })
		s.queues[i] = append(q[:k], append([]store.Event{ev}, q[k:]...)...)
	}
}

// flushLocked publishes, in RV order, every queued event at or below the
// lowest watermark, then that watermark as progress.
func (s *Source) flushLocked() {
	low := s.wm[0]
	for _, w := range s.wm {
		low = min(low, w)
	}
	if low <= s.hub.LastRV() {
		return
	}
	var batch []store.Event
	for k, q := range s.queues {
		n := sort.Search(len(q), func(j int) bool { return q[j].RV > low })
		batch = append(batch, q[:n]...)
		s.queues[k] = q[n:]
	}
	if len(batch) > 0 {
		sort.SliceStable(batch, func(a, b int) bool { return batch[a].RV < batch[b].RV })
		s.hub.Publish(batch)
	}
	s.hub.Progress(low)
}

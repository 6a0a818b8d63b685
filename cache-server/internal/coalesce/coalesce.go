// Package coalesce runs one fetch for many concurrent callers, with the
// guarantee a consistent read needs: a caller's result comes from a run
// that started after a moment the caller names. Do names the call itself;
// Since names an earlier one, the moment the caller's request was
// received.
//
// Why the request's receipt: a consistent read must see every write that
// completed before it was received, and an RV fetched by a run that
// started after that moment covers them, however long the request then
// waited. Requests wait in priority and fairness's queues before they
// execute: under a flood of consistent LISTs (hack/bench -mode flood) a
// standalone tier executed them one at a time, each fetched the
// apiserver's RV anew (a run started after its call), and the apiserver
// and etcd spent about 0.6 of this machine's two cores answering the
// fetches, beside the tier's 0.75. A run that started after a queued
// request was received serves it as well, and every request queued behind
// it.
package coalesce

import (
	"context"
	"sync"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
)

// runTimeout bounds a run: it is shared, so it must not end with its first
// caller's context.
const runTimeout = 30 * time.Second

// Runs coalesces the runs of one fetch (an RV fetch, a relist probe).
type Runs struct {
	fn func(ctx context.Context) (uint64, error)

	mu      sync.Mutex
	running *run // in flight
	next    *run // the run new callers join; starts when running ends
	last    *run // the latest run that succeeded
}

type run struct {
	started time.Time
	done    chan struct{}
	rv      uint64
	err     error
}

// New coalesces the runs of fn.
func New(fn func(ctx context.Context) (uint64, error)) *Runs {
	return &Runs{fn: fn}
}

// Do returns the result of a run of fn that started after the call: a run
// already in flight may have read its RV before the caller's request
// arrived, so the caller waits for the next one, with every other caller
// that arrives meanwhile.
func (r *Runs) Do(ctx context.Context) (uint64, error) {
	return r.Since(ctx, time.Now())
}

// Since returns the result of a run of fn that started after since: the
// latest successful run if it did (no wait), else the run in flight if it
// did, else the next run. A failed run is never reused by later callers.
func (r *Runs) Since(ctx context.Context, since time.Time) (uint64, error) {
	r.mu.Lock()
	if l := r.last; l != nil && l.started.After(since) {
		r.mu.Unlock()
		return l.rv, nil
	}
	var w *run
	if c := r.running; c != nil && c.started.After(since) {
		w = c
	} else {
		if r.next == nil {
			r.next = &run{done: make(chan struct{})}
		}
		w = r.next
		if r.running == nil {
			r.startLocked()
		}
	}
	r.mu.Unlock()
	select {
	case <-w.done:
		return w.rv, w.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Received is when the request of ctx was received (the server's chain
// records it: filters.WithRequestReceivedTimestamp), or now when nothing
// recorded it (a shard's request from a front, a background caller).
func Received(ctx context.Context) time.Time {
	if t, ok := request.ReceivedTimestampFrom(ctx); ok {
		return t
	}
	return time.Now()
}

func (r *Runs) startLocked() {
	cur := r.next
	r.next = nil
	cur.started = time.Now()
	r.running = cur
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		cur.rv, cur.err = r.fn(ctx)
		cancel()
		r.mu.Lock()
		r.running = nil
		if cur.err == nil {
			r.last = cur
		}
		close(cur.done)
		if r.next != nil {
			r.startLocked()
		}
		r.mu.Unlock()
	}()
}

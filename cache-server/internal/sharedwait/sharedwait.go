// Package sharedwait lets concurrent waits for "the state has reached at
// least version v" share one call. A fleet's front uses it for consistent
// reads: each one used to ask every shard to prove its freshness on its
// own; now reads waiting at the same time share the shards' answers.
package sharedwait

import (
	"context"
	"sync"
)

// Group shares waits. The zero value is ready to use.
type Group struct {
	mu   sync.Mutex
	runs []*run // in flight
}

type run struct {
	target uint64
	done   chan struct{}
	err    error // set before done is closed
	// waiters still interested; at 0 the run is cancelled and forgotten.
	waiters int
	cancel  context.CancelFunc
}

// Wait returns once a call fn(ctx, t) with t >= target has returned: the
// result of a call in flight whose target is at least target (the lowest
// such), or of a new call with target. A call runs under its own context,
// not a caller's: it ends when it returns, or is cancelled when every
// caller waiting for it has gone (their contexts ended). Wait returns the
// call's error, or ctx's error when ctx ends first.
//
// Joining a call in flight is safe for "at least" waits: a call that
// returns without error has reached its target, which is at least the
// caller's, whenever the call started.
func (g *Group) Wait(ctx context.Context, target uint64, fn func(ctx context.Context, target uint64) error) error {
	g.mu.Lock()
	r := g.joinLocked(target)
	if r == nil {
		var runCtx context.Context
		runCtx, cancel := context.WithCancel(context.Background())
		r = &run{target: target, done: make(chan struct{}), waiters: 1, cancel: cancel}
		g.runs = append(g.runs, r)
		go func() {
			err := fn(runCtx, target)
			g.mu.Lock()
			g.forgetLocked(r)
			g.mu.Unlock()
			r.err = err
			close(r.done)
			cancel()
		}()
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		g.mu.Lock()
		r.waiters--
		if r.waiters == 0 {
			// Nobody is left to use its answer.
			g.forgetLocked(r)
			r.cancel()
		}
		g.mu.Unlock()
		return ctx.Err()
	}
}

// joinLocked returns the run in flight with the lowest target >= target,
// counting the caller as its waiter, or nil.
func (g *Group) joinLocked(target uint64) *run {
	var best *run
	for _, r := range g.runs {
		if r.target >= target && (best == nil || r.target < best.target) {
			best = r
		}
	}
	if best != nil {
		best.waiters++
	}
	return best
}

func (g *Group) forgetLocked(r *run) {
	for i, x := range g.runs {
		if x == r {
			g.runs = append(g.runs[:i], g.runs[i+1:]...)
			return
		}
	}
}

// InFlight is the number of calls running (for tests and metrics).
func (g *Group) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.runs)
}

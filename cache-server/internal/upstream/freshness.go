package upstream

import (
	"context"
	"sync"
	"time"
)

// coalescer runs fn for many concurrent callers with one guarantee: a
// caller's result comes from a run that *started after the caller arrived*.
// That is what makes a shared RV fetch safe for consistent reads: a fetch
// already in flight may have read the RV before the caller's request
// arrived, so late callers wait for the next run instead of joining it.
type coalescer struct {
	fn func(ctx context.Context) (uint64, error)

	mu      sync.Mutex
	running bool
	next    *coalescedRun // the run new callers join; starts when the current one ends
}

type coalescedRun struct {
	done chan struct{}
	rv   uint64
	err  error
}

// do returns the result of a run of fn that started after the call.
func (c *coalescer) do(ctx context.Context) (uint64, error) {
	c.mu.Lock()
	if c.next == nil {
		c.next = &coalescedRun{done: make(chan struct{})}
	}
	run := c.next
	if !c.running {
		c.startLocked()
	}
	c.mu.Unlock()
	select {
	case <-run.done:
		return run.rv, run.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (c *coalescer) startLocked() {
	run := c.next
	c.next = nil
	c.running = true
	go func() {
		// The run is shared, so it must not die with the first caller's
		// context; it is bounded by its own timeout instead.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		run.rv, run.err = c.fn(ctx)
		cancel()
		close(run.done)
		c.mu.Lock()
		c.running = false
		if c.next != nil {
			c.startLocked()
		}
		c.mu.Unlock()
	}()
}

// probeGrace is how long a wait gives the main stream to reach its target
// before it starts progress probes (when none are running already): on a
// resource that is itself being written the stream is a few milliseconds
// behind at most, and a probe there would be one more watcher of every
// event for a second, for nothing.
const probeGrace = 20 * time.Millisecond

// WaitFresh blocks until the cache has applied the upstream stream up to
// target, or ctx ends. The main stream usually gets there on its own; for a
// quiet resource nothing arrives on it (the apiserver sends it a bookmark
// only about once a minute), so the wait asks for progress probes
// (progress.go), whose bookmarks prove that every event up to their RV has
// been seen. For a resource the apiserver serves without a watch cache
// (no bookmarks at all) it re-reads the resource instead (relistProbe).
func (in *Ingester) WaitFresh(ctx context.Context, target uint64) error {
	var relistDone chan error
	var grace <-chan time.Time
	for {
		in.gate.Lock()
		applied, changed := in.applied, in.changed
		in.gate.Unlock()
		if applied >= target {
			return nil
		}
		switch {
		case in.bookmarkless.Load():
			if relistDone == nil {
				relistDone = make(chan error, 1)
				go func(done chan<- error) {
					_, err := in.probe.do(ctx)
					done <- err
				}(relistDone)
			}
		case grace == nil && !in.probing():
			grace = time.After(probeGrace)
		default:
			in.wantProgress()
		}
		select {
		case <-changed:
		case <-grace:
			in.wantProgress()
		case err := <-relistDone:
			relistDone = nil
			if err != nil {
				// Do not spin on a failing apiserver; the freshness
				// timeout in ctx bounds the whole wait.
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

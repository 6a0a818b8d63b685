package upstream

import (
	"context"
	"time"
)

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
					_, err := in.probe.Do(ctx)
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

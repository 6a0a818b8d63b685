package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	rtrace "runtime/trace"
	"time"
)

// nodeListRegion is the runtime/trace region around each of the node's
// LISTs, which hack/tracewaits matches with the server's handlers.
const nodeListRegion = "node-list"

// startFloodTrace takes, over one phase of d, a Go execution trace of the
// bench (the victims' client, its node LISTs in nodeListRegion regions)
// and one of the server's own process (its /debug/pprof/trace: the
// apiserver, a standalone tier, a fleet's front; for the rows through the
// aggregator the tier behind it, so the apiserver's proxying counts as
// "until the server saw it"), into dir as <server>-<phase>[-<n>]-bench.trace and
// -server.trace; hack/tracewaits reads the pair. The returned stop ends
// the bench's trace and waits for the server's.
//
// Why: under a flood a victim's p99 is its few slowest requests, and their
// time is mostly outside the handler (the network poll of a busy runtime,
// the connection's goroutines, the client's own); only the two traces
// together say where. Tracing costs both processes CPU: the phase's other
// numbers are not comparable with an untraced run's.
func startFloodTrace(dir string, s floodServer, phase string, d time.Duration) (func() error, error) {
	base := filepath.Join(dir, s.key+"-"+phase)
	for n := 2; ; n++ {
		if _, err := os.Stat(base + "-bench.trace"); os.IsNotExist(err) {
			break
		}
		base = filepath.Join(dir, fmt.Sprintf("%s-%s-%d", s.key, phase, n))
	}
	f, err := os.Create(base + "-bench.trace")
	if err != nil {
		return nil, err
	}
	if err := rtrace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("tracing the bench: %w", err)
	}
	// The server's trace ends before the phase does, so that it holds
	// only requests the bench's trace holds too.
	seconds := max(1, int((d - 2*time.Second).Seconds()))
	fetched := make(chan error, 1)
	go func() {
		body, err := getOK(s.admin, fmt.Sprintf("/debug/pprof/trace?seconds=%d", seconds))
		if err == nil {
			err = os.WriteFile(base+"-server.trace", body, 0o644)
		}
		fetched <- err
	}()
	return func() error {
		rtrace.Stop()
		err := f.Close()
		if ferr := <-fetched; ferr != nil {
			return fmt.Errorf("the %s's trace: %w", s.name, ferr)
		}
		return err
	}, nil
}

// inNodeListRegion runs fn, one node LIST, inside a nodeListRegion region
// (a no-op unless the bench is being traced).
func inNodeListRegion(fn func()) {
	defer rtrace.StartRegion(context.Background(), nodeListRegion).End()
	fn()
}

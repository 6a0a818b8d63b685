package upstream

// Progress probes: proof that the cache has applied the apiserver's stream
// up to an RV when the resource itself is quiet.
//
// When kube-apiserver sends a watch bookmark (k8s.io/apiserver v0.37.1,
// pkg/storage/cacher; docs/consistent-reads.md has the details):
//
//   - Cacher.dispatchEvents sends bookmarks only when its bookmark timer
//     fires, every 1–1.25 s (wait.Jitter(time.Second, 0.25)), carrying
//     lastProcessedResourceVersion: the RV of the last event, or etcd
//     progress notification, it took from its queue. Bookmarks from etcd
//     are not forwarded to watchers.
//   - At a tick it sends them only to the watchers that are due
//     (startDispatchingBookmarkEventsLocked, watcherBookmarkTimeBuckets:
//     one-second buckets counted from the cacher's start; a tick pops every
//     bucket up to the current second).
//   - cacheWatcher.nextBookmarkTime: a watcher is due at
//     min(now + 1 min, deadline - 2 s), and never if deadline - 2 s has
//     passed when it registers. The deadline is the request's
//     timeoutSeconds (handlers.handleWatch). So with timeoutSeconds=3 a
//     watch is due one second after it opened, which falls in the bucket
//     after the one it opened in: the first tick in a later bucket pops
//     it. 2 is too short: no bookmark at all.
//   - cacheWatcher.process forwards a bookmark only if its RV is above
//     what the watcher has already sent.
//   - The RV fetch (a consistent watch-list or LIST) makes the cacher wait
//     until etcd's progress notification has brought its RV to etcd's
//     revision (watchCache.waitUntilFreshLocked, which asks etcd for
//     progress every 100 ms while anyone waits), so after a fetch returned
//     T, every later tick carries an RV >= T.
//
// So the earliest proof for a read is the cacher's next tick after its RV
// fetch, if one of our watches is due at that tick. Ticks are at least a
// second apart, so there is at most one per bucket, and a probe opened in
// bucket B-1 is due at the tick of bucket B (or the first one after). A
// probe opened on demand misses the next tick whenever that tick falls in
// the bucket the probe opened in (then it waits for the one after: 1.1 s
// on average). The prober therefore keeps a probe due at every tick while
// reads wait: it opens one at least every probeCadence (< 1 s, so every
// bucket holds one, with room for delays), and another as soon as one delivers its bookmark
// (just after a tick, so due at the next one). A probe is a watch
// from the applied RV, so it also delivers any event the main stream has
// not delivered yet, in order: its bookmark proves everything up to its RV.
//
// Cost to the apiserver: about one short watch per second per resource,
// only while consistent reads of a quiet resource keep arriving (and
// probeLinger after the last one).

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"sync"
	"time"
)

const (
	// probeTimeoutSeconds: the shortest timeout that makes the apiserver
	// send the watch a pre-timeout bookmark (see above).
	probeTimeoutSeconds = 3
	// probeCadence: the longest gap between two probes while reads wait.
	// Under a second, so that every one-second bookmark bucket of the
	// cacher holds a probe's due time. The apiserver computes the due time
	// from when it registers the watch, so the slack below a second must
	// absorb the delays of opening it on a loaded machine: with 900 ms,
	// a 2-shard fleet on a machine at load 12 (2 cores) saw a quiet
	// read's wait take a tick more than it needed now and then (p99
	// 2.2 s); one probe more every few seconds is cheap.
	probeCadence = 700 * time.Millisecond
	// probeLinger: how long the prober goes on after the last read that
	// asked for progress. A read that arrives while it runs finds a probe
	// due at the cacher's next tick; one that starts it may wait for the
	// tick after (about one second more).
	probeLinger = 10 * time.Second
)

// prober is the state of the ingester's progress probes.
type prober struct {
	// cadence and linger are probeCadence and probeLinger (tests shorten
	// them).
	cadence, linger time.Duration

	mu      sync.Mutex
	until   time.Time // keep probing until then
	running bool
}

// probing reports whether the prober runs.
func (in *Ingester) probing() bool {
	in.prober.mu.Lock()
	defer in.prober.mu.Unlock()
	return in.prober.running
}

// wantProgress keeps the progress probes going for probeLinger from now,
// starting them if needed.
func (in *Ingester) wantProgress() {
	p := &in.prober
	p.mu.Lock()
	defer p.mu.Unlock()
	p.until = time.Now().Add(p.linger)
	if !p.running {
		p.running = true
		in.opts.Log.V(1).Info("progress probes started", "resource", in.res, "appliedRV", in.AppliedRV(), "latestRV", in.latestRV.Load())
		go in.runProber()
	}
}

// proberStops reports whether the prober is to stop now, and if so marks
// it stopped (under the lock, so a concurrent wantProgress starts a new
// one rather than extending one that is leaving).
func (in *Ingester) proberStops() bool {
	p := &in.prober
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().Before(p.until) && in.life.Err() == nil && !in.bookmarkless.Load() {
		return false
	}
	p.running = false
	return true
}

// runProber opens probes while reads want progress (see the file comment).
func (in *Ingester) runProber() {
	defer in.opts.Log.V(1).Info("progress probes stopped", "resource", in.res, "appliedRV", in.AppliedRV())
	backoff := 100 * time.Millisecond
	for !in.proberStops() {
		select {
		case <-in.synced:
		case <-in.life.Done():
			continue
		}
		p := in.startProbe(in.AppliedRV())
		next := time.NewTimer(in.prober.cadence)
		select {
		case <-p.bookmarked:
			backoff = 100 * time.Millisecond
		case <-p.done:
			if p.err != nil {
				// Do not hammer a failing apiserver; waiting reads time
				// out on their own.
				select {
				case <-time.After(backoff):
				case <-in.life.Done():
				}
				backoff = min(2*backoff, 2*time.Second)
			}
		case <-next.C:
		case <-in.life.Done():
		}
		next.Stop()
	}
}

// probeRun is one probe in flight.
type probeRun struct {
	bookmarked chan struct{} // closed when its bookmark was applied
	done       chan struct{} // closed when it ended; err is set then
	err        error
}

func (in *Ingester) startProbe(from uint64) *probeRun {
	p := &probeRun{bookmarked: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		ctx, cancel := context.WithTimeout(in.life, (probeTimeoutSeconds+10)*time.Second)
		defer cancel()
		start := time.Now()
		outcome, err := in.probeOnce(ctx, from, func() {
			in.opts.Metrics.ProgressProbeBookmark.WithLabelValues(in.res).Observe(time.Since(start).Seconds())
			close(p.bookmarked)
		})
		p.err = err
		in.opts.Metrics.ProgressProbes.WithLabelValues(in.res, outcome).Inc()
		if err != nil && in.life.Err() == nil {
			in.opts.Log.V(1).Info("progress probe failed", "resource", in.res, "fromRV", from, "err", err)
		}
		if outcome == probeBecameBookmarkless {
			// Reads re-read the resource from now on; this re-read is
			// for those already waiting (they wait on progress, and the
			// prober stops).
			_, _ = in.probe.Do(in.life)
		}
	}()
	return p
}

// Outcomes of a probe (the outcome label of
// cachetier_upstream_progress_probes_total).
const (
	probeBookmark           = "bookmark"     // got its bookmark
	probeNothingDue         = "nothing_due"  // ended without one, none was due
	probeLate               = "late"         // ended without one although one was due
	probeBecameBookmarkless = "bookmarkless" // ... and the resource is taken to have no watch cache
	probeError              = "error"        // the request or the stream failed
)

// probeOnce watches from `from` until the first bookmark, feeding every
// event through the gate like the main stream, and closes the watch then.
func (in *Ingester) probeOnce(ctx context.Context, from uint64, bookmarked func()) (string, error) {
	// The apiserver's cache was already at least this fresh when the
	// probe opened (a fetch returned it): a bookmark is due at its tick
	// unless the watch itself has delivered up to it.
	latestAtOpen := in.latestRV.Load()
	q := url.Values{}
	q.Set("resourceVersion", strconv.FormatUint(from, 10))
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", strconv.Itoa(probeTimeoutSeconds))
	s, err := openWatch(ctx, in.opts.Client, in.opts.Host, in.opts.Resource, q)
	if err != nil {
		return probeError, err
	}
	defer s.Close()
	sent := from // what the apiserver has sent on this watch
	for {
		ev, err := s.next()
		if err == io.EOF {
			return in.probeEndedWithoutBookmark(from, sent, latestAtOpen), nil
		}
		if err != nil {
			return probeError, fmt.Errorf("probe stream ended without a bookmark: %w", err)
		}
		rv, err := in.handleRV(ev)
		if err != nil {
			return probeError, err
		}
		if ev.Type == "BOOKMARK" {
			in.probeMisses.Store(0)
			bookmarked()
			return probeBookmark, nil
		}
		sent = max(sent, rv)
	}
}

// probeEndedWithoutBookmark classifies a probe that ran to its timeout
// without a bookmark, and decides whether the apiserver serves the
// resource without a watch cache (etcd-backed watches carry no
// bookmarks).
func (in *Ingester) probeEndedWithoutBookmark(from, sent, latestAtOpen uint64) string {
	if latestAtOpen <= sent {
		// Nothing newer than what the watch delivered was known to the
		// apiserver: no bookmark was due, and nothing is learned.
		return probeNothingDue
	}
	// A bookmark was due and did not come: either there is no watch cache
	// or it was late (an apiserver short of CPU misses the pre-timeout
	// bookmark now and then).
	misses := in.probeMisses.Add(1)
	if !bookmarklessAfter(in.sawBookmark.Load(), misses) {
		in.opts.Log.V(1).Info("progress probe ended without its bookmark; the apiserver's bookmark was late", "resource", in.res, "fromRV", from, "latestRV", latestAtOpen, "inARow", misses)
		return probeLate
	}
	in.bookmarkless.Store(true)
	in.opts.Log.Info("upstream sends no bookmarks for this resource (no watch cache in the apiserver); consistent reads will re-read it when its stream is quiet", "resource", in.res, "probesWithoutBookmark", misses)
	return probeBecameBookmarkless
}

// runRelistProbe is the coalesced progress relist of a bookmarkless
// resource (Ingester.probe).
func (in *Ingester) runRelistProbe(ctx context.Context) (uint64, error) {
	select {
	case <-in.synced:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	rv, err := in.relistProbe(ctx)
	outcome := "relist"
	if err != nil {
		outcome = probeError
		in.opts.Log.V(1).Info("progress relist failed", "resource", in.res, "err", err)
	}
	in.opts.Metrics.ProgressProbes.WithLabelValues(in.res, outcome).Inc()
	return rv, err
}

// relistProbe proves progress for a resource whose upstream sends no
// bookmarks: a consistent watch-list reads the state at the current RV and
// the difference is applied as events. Costly (a full read of the
// resource), so it only runs for consistent reads that find the main stream
// quiet, and concurrent readers share one.
func (in *Ingester) relistProbe(ctx context.Context) (uint64, error) {
	in.opts.Metrics.UpstreamRelists.WithLabelValues(in.res, "progress").Inc()
	objs, rv, s, err := in.readInitialState(ctx, "60")
	if err != nil {
		return 0, err
	}
	s.Close()
	if err := in.replaceIfNewer(objs, rv); err != nil {
		return 0, err
	}
	return in.AppliedRV(), nil
}

// probeMissesForBookmarkless is how many progress probes in a row must end
// without a due bookmark before a resource that never showed one is taken
// to be served without a watch cache.
const probeMissesForBookmarkless = 3

// bookmarklessAfter decides, after a progress probe ended without a due
// bookmark (misses in a row), whether the apiserver serves the resource
// without a watch cache. A resource that ever carried a bookmark (on the
// main stream or a probe) is served from the watch cache: its missing
// bookmark was late, and re-reading the whole resource — what a
// bookmarkless resource costs per quiet consistent read — would be the
// wrong answer (under load it doubled the tier's memory: a 130 MiB
// resource read again while 64 watch-lists streamed it). Otherwise one
// late bookmark is not enough to decide.
func bookmarklessAfter(sawBookmark bool, misses int32) bool {
	return !sawBookmark && misses >= probeMissesForBookmarkless
}

package upstream

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
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

// rvProbeName is a metadata.name no object can have ("/" is never valid in a
// name), so the watch-list below streams no initial events.
const rvProbeName = "cachetier/rv-probe"

// CurrentRV returns the apiserver's current resourceVersion for this
// resource, from a fetch that started after the call (coalesced across
// callers). It asks for a consistent watch-list that matches nothing: the
// apiserver answers with its initial-events-end bookmark at its current RV
// in a millisecond or two, and has made its own watch cache for the
// resource at least that fresh — so later bookmarks on our streams will
// carry an RV at least this high.
func (in *Ingester) CurrentRV(ctx context.Context) (uint64, error) {
	return in.rvFetch.do(ctx)
}

func (in *Ingester) fetchCurrentRV(ctx context.Context) (uint64, error) {
	rv, err := in.doFetchCurrentRV(ctx)
	outcome := "ok"
	if err != nil {
		outcome = "error"
	} else {
		in.opts.Metrics.UpstreamLatestRV.WithLabelValues(in.res).Set(float64(rv))
		for {
			cur := in.latestRV.Load()
			if rv <= cur || in.latestRV.CompareAndSwap(cur, rv) {
				break
			}
		}
	}
	in.opts.Metrics.RVFetches.WithLabelValues(in.res, outcome).Inc()
	return rv, err
}

func (in *Ingester) doFetchCurrentRV(ctx context.Context) (uint64, error) {
	q := url.Values{}
	q.Set("sendInitialEvents", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersionMatch", "NotOlderThan")
	q.Set("fieldSelector", "metadata.name="+rvProbeName)
	q.Set("timeoutSeconds", "10")
	s, err := openWatch(ctx, in.opts.Client, in.opts.Host, in.opts.Resource, q)
	if watchListRefused(err) {
		// Without watch-list the next cheapest consistent read is a LIST
		// of one item: its RV is the apiserver's current one.
		lq := url.Values{}
		lq.Set("limit", "1")
		page, lerr := getList(ctx, in.opts.Client, in.opts.Host+in.opts.Resource.Path(), in.opts.Resource, lq)
		if lerr != nil {
			return 0, fmt.Errorf("fetch current RV of %s: %w", in.res, lerr)
		}
		return ParseRV(page.Metadata.ResourceVersion)
	}
	if err != nil {
		return 0, fmt.Errorf("fetch current RV of %s: %w", in.res, err)
	}
	defer s.Close()
	for {
		ev, err := s.next()
		if err != nil {
			return 0, fmt.Errorf("fetch current RV of %s: %w", in.res, err)
		}
		switch ev.Type {
		case "BOOKMARK":
			rv, end, err := bookmarkInfo(ev.Object)
			if err != nil {
				return 0, err
			}
			if end {
				return rv, nil
			}
		case "ERROR":
			return 0, eventStatus(ev.Object)
		}
	}
}

// WaitFresh blocks until the cache has applied the upstream stream up to
// target, or ctx ends. The main stream usually gets there on its own; for a
// quiet resource nothing would arrive on it (the apiserver sends periodic
// bookmarks only about once a minute), so a short progress probe is run: a
// watch from our applied RV that delivers any missed events and then a
// bookmark, which proves everything up to its RV has been seen.
func (in *Ingester) WaitFresh(ctx context.Context, target uint64) error {
	var probeDone chan error
	for {
		in.gate.Lock()
		applied, changed := in.applied, in.changed
		in.gate.Unlock()
		if applied >= target {
			return nil
		}
		if probeDone == nil {
			probeDone = make(chan error, 1)
			go func(done chan<- error) {
				_, err := in.probe.do(ctx)
				done <- err
			}(probeDone)
		}
		select {
		case <-changed:
		case err := <-probeDone:
			probeDone = nil
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

// runProbe opens a short watch from the applied RV and feeds it through the
// same gate as the main stream until the first bookmark.
func (in *Ingester) runProbe(ctx context.Context) (uint64, error) {
	rv, err := in.doProbe(ctx)
	outcome := "ok"
	if err != nil {
		outcome = "error"
		in.opts.Log.V(1).Info("progress probe failed", "resource", in.res, "err", err)
	}
	in.opts.Metrics.ProgressProbes.WithLabelValues(in.res, outcome).Inc()
	return rv, err
}

func (in *Ingester) doProbe(ctx context.Context) (uint64, error) {
	if !in.isSyncedNow() {
		select {
		case <-in.synced:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if in.bookmarkless.Load() {
		return in.relistProbe(ctx)
	}
	from := in.AppliedRV()
	q := url.Values{}
	q.Set("resourceVersion", strconv.FormatUint(from, 10))
	q.Set("allowWatchBookmarks", "true")
	// The apiserver's watch cache sends a bookmark to a watcher shortly
	// before its deadline; a 3s timeout gets one after about 1-2s.
	q.Set("timeoutSeconds", "3")
	s, err := openWatch(ctx, in.opts.Client, in.opts.Host, in.opts.Resource, q)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	for {
		ev, err := s.next()
		if err == io.EOF {
			if in.latestRV.Load() <= from {
				// Nothing newer upstream, so no bookmark was due: no proof
				// needed and nothing learned.
				return in.AppliedRV(), nil
			}
			// The watch ran to its timeout without a bookmark although the
			// apiserver is past our RV. Either it serves this resource
			// without a watch cache (etcd-backed watches carry no
			// bookmarks; only a fresh read of the whole state proves
			// progress then) or its bookmark was late: an apiserver short
			// of CPU misses the pre-timeout bookmark now and then.
			misses := in.probeMisses.Add(1)
			if !bookmarklessAfter(in.sawBookmark.Load(), misses) {
				return 0, fmt.Errorf("progress probe from RV %d ended without a bookmark (%d in a row); the apiserver's bookmark was late", from, misses)
			}
			in.bookmarkless.Store(true)
			in.opts.Log.Info("upstream sends no bookmarks for this resource (no watch cache in the apiserver); consistent reads will re-read it when its stream is quiet", "resource", in.res, "probesWithoutBookmark", misses)
			return in.relistProbe(ctx)
		}
		if err != nil {
			return 0, fmt.Errorf("probe stream ended without a bookmark: %w", err)
		}
		if err := in.handle(ev); err != nil {
			return 0, err
		}
		if ev.Type == "BOOKMARK" {
			in.probeMisses.Store(0)
			return in.AppliedRV(), nil
		}
	}
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
// without a bookmark before a resource that never showed one is taken to be
// served without a watch cache.
const probeMissesForBookmarkless = 3

// bookmarklessAfter decides, after a progress probe ended without a
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

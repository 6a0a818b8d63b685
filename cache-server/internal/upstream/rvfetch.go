package upstream

import (
	"context"
	"fmt"
	"net/url"

	"github.com/cachetier/cachetier/cache-server/internal/coalesce"
)

// The RV fetch reads one key of the resource that no client can have
// created. kube-apiserver serves a request whose field selector is
// metadata.name=<n> (and, for a namespaced resource, whose path names a
// namespace) as a read of the single key <prefix>/<namespace>/<n>
// (registry.Store.WatchPredicate / ListPredicate: KeyFunc succeeds, so
// Recursive=false), and its watch cache then builds a watch-list's initial
// state with one GetByKey (watchCache.getIntervalFromStoreLocked with
// matchesSingle) instead of walking every object of the resource
// (newCacheIntervalFromLazySnapshot lists the whole store, whatever the
// namespace in the key). The cost to the apiserver is then independent of
// the resource's size; see docs/consistent-reads.md for the measurements.
//
// The name must be a valid path segment (registry.NamespaceKeyFunc rejects
// "/" and "%", and with an invalid name the apiserver silently falls back
// to the recursive walk: the old probe name, "cachetier/rv-probe", cost
// ~1.1 µs of apiserver CPU per object of the resource). ':' is valid in a
// path segment but not in the DNS subdomain names almost every resource
// requires, so no such object exists; where one could (RBAC names allow
// ':'), the fetch merely carries it, and ignores it.
const (
	rvFetchNamespace = "cachetier-rv-fetch"
	rvFetchName      = "cachetier:rv-fetch"
)

// rvFetchPath is the collection the RV fetch reads: the resource inside
// rvFetchNamespace, or the resource itself when it is cluster-scoped.
func rvFetchPath(res Resource) string {
	if res.Namespaced {
		return namespacedPath(res, rvFetchNamespace)
	}
	return res.Path()
}

// rvFetchWatchQuery is the consistent watch-list of rvFetchName: the
// apiserver reads etcd's current revision (GetCurrentResourceVersion),
// waits until its watch cache for the resource has applied it
// (waitUntilWatchCacheFreshAndForceAllEvents, which asks etcd for a
// progress notification) and answers with the initial-events-end bookmark
// at the watch cache's RV, at least that revision.
func rvFetchWatchQuery() url.Values {
	q := url.Values{}
	q.Set("sendInitialEvents", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersionMatch", "NotOlderThan")
	q.Set("fieldSelector", "metadata.name="+rvFetchName)
	q.Set("timeoutSeconds", "10")
	return q
}

// rvFetchListQuery is the same read as a consistent LIST, for an apiserver
// that refuses watch-list: served from the watch cache after the same wait
// (watchCache.waitUntilFreshAndGetList) or, without consistent reads from
// cache, by one etcd Get; either way its list RV is at least etcd's
// revision when the request arrived.
func rvFetchListQuery() url.Values {
	q := url.Values{}
	q.Set("fieldSelector", "metadata.name="+rvFetchName)
	return q
}

// CurrentRV returns the apiserver's current resourceVersion for this
// resource, from a fetch that started after the request of ctx was received
// (coalesce.Received: a fetch that started after the call when no request
// is named), coalesced across callers. The apiserver has made its own watch cache for the resource at
// least that fresh, so later bookmarks on our streams carry an RV at least
// this high (the progress probes rely on it).
func (in *Ingester) CurrentRV(ctx context.Context) (uint64, error) {
	return in.rvFetch.Since(ctx, coalesce.Received(ctx))
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
	u := in.opts.Host + rvFetchPath(in.opts.Resource)
	if !in.rvFetchByList.Load() {
		rv, err := in.fetchRVByWatchList(ctx, u)
		if !watchListRefused(err) {
			return rv, err
		}
		// The apiserver's WatchList feature is off; it does not change
		// while it runs, so stop asking (one request per fetch, not two).
		in.rvFetchByList.Store(true)
		in.opts.Log.Info("the apiserver refused the watch-list RV fetch; fetching the RV with a LIST of one key", "resource", in.res, "err", err)
	}
	page, err := getList(ctx, in.opts.Client, u, in.opts.Resource, rvFetchListQuery())
	if err != nil {
		return 0, fmt.Errorf("fetch current RV of %s: %w", in.res, err)
	}
	return ParseRV(page.Metadata.ResourceVersion)
}

// fetchRVByWatchList sends the watch-list RV fetch to u and reads it to its
// initial-events-end bookmark. A refusal is returned as the apiserver's
// status error, unwrapped, for watchListRefused.
func (in *Ingester) fetchRVByWatchList(ctx context.Context, u string) (uint64, error) {
	q := rvFetchWatchQuery()
	q.Set("watch", "1")
	resp, err := get(ctx, in.opts.Client, u, in.opts.Resource, q)
	if err != nil {
		return 0, err
	}
	s := newEventStream(resp.Body, shortStreamBuffer)
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
		// An ADDED event: an object with rvFetchName exists (see above);
		// its RV says nothing about the resource's.
	}
}

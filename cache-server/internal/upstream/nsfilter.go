package upstream

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// NamespaceFilter restricts a namespaced resource to the namespaces whose
// labels match Selector (the profile's namespaceSelector).
//
// Design. Objects in namespaces that do not match are never stored: the
// filter is applied at ingestion, under the ingester's gate, against the set
// of namespaces the store currently holds ("admitted"). That set changes only
// under the gate, together with the store, when a namespace's labels start or
// stop matching:
//
//   - leaving: the namespace's objects are removed from the store in the same
//     critical section that drops it from the admitted set;
//   - entering: the namespace is marked pending, and from then on the main
//     stream's events for it go to a side buffer instead of being dropped.
//     The namespace's objects are read with a consistent LIST restricted to
//     it (RV R), the ingester waits until its stream has applied R, and then,
//     under the gate, installs for that namespace the newer of the LIST's
//     object and the buffered event for each key (a buffered DELETE newer
//     than the listed object wins). Every event after R was buffered and
//     everything up to R is in the LIST, so the namespace's content equals
//     the apiserver's at the store's applied RV: the cache never claims an RV
//     whose data it does not have.
//
// Both changes are applied with store.Replace at the store's applied RV (no
// upstream RV belongs to a namespace relabel of another resource), and their
// difference is published like a relist's: ADDED/DELETED events for
// downstream watchers. A full relist (start-up, 410) recomputes the admitted
// set from the namespace watcher's current view and cancels pending entries.
type NamespaceFilter struct {
	Selector   labels.Selector
	Namespaces NamespaceSource
}

// nsState is the ingester's namespace-filter state, guarded by its gate.
type nsState struct {
	admitted map[string]bool
	pending  map[string]*nsBuffer
	// gen changes with every full relist; a namespace entry that started
	// before one is discarded and retried.
	gen   uint64
	queue chan string
}

// nsBuffer holds the main stream's events for a namespace being entered:
// the newest state per key (Deleted marks a deletion).
type nsBuffer struct {
	events map[string]store.Event
}

func (in *Ingester) nsFilterEnabled() bool { return in.opts.Namespaces != nil }

// nsMatches is the desired membership of a namespace.
func (in *Ingester) nsMatches(ns string) bool {
	l, ok := in.opts.Namespaces.Namespaces.Labels(ns)
	return ok && in.opts.Namespaces.Selector.Matches(labels.Set(l))
}

// filterEventLocked handles an event of an object outside the admitted
// namespaces: it is buffered for a pending namespace or dropped, and in
// both cases counts as progress. It reports whether the event was consumed.
func (in *Ingester) filterEventLocked(ev store.Event) bool {
	if !in.nsFilterEnabled() || in.nsAdmittedLocked(ev.Object.Namespace) {
		return false
	}
	if b := in.ns.pending[ev.Object.Namespace]; b != nil {
		b.events[ev.Object.Key] = ev
	}
	in.opts.Store.MarkProgress(ev.RV)
	in.advanceLocked(ev.RV)
	if in.opts.OnProgress != nil {
		in.opts.OnProgress(ev.RV)
	}
	return true
}

// filterReplaceLocked filters a full relist and resets the admitted set to
// the namespace watcher's current view.
func (in *Ingester) filterReplaceLocked(objs []*store.Object) []*store.Object {
	if !in.nsFilterEnabled() {
		return objs
	}
	in.ns.gen++
	in.ns.pending = map[string]*nsBuffer{}
	in.ns.admitted = map[string]bool{}
	out := objs[:0:0]
	for _, o := range objs {
		if in.nsAdmittedLocked(o.Namespace) {
			out = append(out, o)
		}
	}
	// Namespaces without objects are decided when their first event
	// arrives (nsAdmittedLocked): nothing of theirs was dropped before.
	return out
}

// runNamespaceSync applies namespace membership changes until ctx ends. It
// runs once the ingester has loaded its initial state.
func (in *Ingester) runNamespaceSync(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-in.synced:
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ns := <-in.ns.queue:
			for ctx.Err() == nil {
				err := in.syncNamespace(ctx, ns)
				if err == nil {
					break
				}
				in.opts.Log.Error(err, "namespace membership change failed; retrying", "resource", in.res, "namespace", ns)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}
}

// enqueueNamespace is the namespace source's callback. It never blocks the
// source: a full queue means a relist is cheaper than queuing more.
func (in *Ingester) enqueueNamespace(ns string) {
	select {
	case in.ns.queue <- ns:
	default:
		go func() { in.ns.queue <- ns }()
	}
}

// nsAdmittedLocked reports a namespace's membership, computing it for a
// namespace not seen yet (no objects so far).
func (in *Ingester) nsAdmittedLocked(ns string) bool {
	ok, seen := in.ns.admitted[ns]
	if !seen {
		ok = in.nsMatches(ns)
		in.ns.admitted[ns] = ok
	}
	return ok
}

// syncNamespace makes the store's content for ns follow its current labels.
func (in *Ingester) syncNamespace(ctx context.Context, ns string) error {
	want := in.nsMatches(ns)
	in.gate.Lock()
	have := in.ns.admitted[ns] // false for a namespace not seen yet
	if want == have {
		in.ns.admitted[ns] = have
		in.gate.Unlock()
		return nil
	}
	if !want {
		err := in.replaceNamespaceLocked(ns, nil, false)
		in.gate.Unlock()
		return err
	}
	if _, busy := in.ns.pending[ns]; busy {
		in.gate.Unlock()
		return nil // an entry in progress already reads the namespace
	}
	buf := &nsBuffer{events: map[string]store.Event{}}
	in.ns.pending[ns] = buf
	in.ns.admitted[ns] = false
	gen := in.ns.gen
	in.gate.Unlock()

	abandon := func() {
		in.gate.Lock()
		if in.ns.pending[ns] == buf {
			delete(in.ns.pending, ns)
		}
		in.gate.Unlock()
	}
	objs, rv, err := in.nsList(ctx, ns)
	if err != nil {
		abandon()
		return err
	}
	objs = in.owned(objs)
	if err := in.WaitFresh(ctx, rv); err != nil {
		abandon()
		return fmt.Errorf("wait for RV %d after listing namespace %s: %w", rv, ns, err)
	}
	in.gate.Lock()
	defer in.gate.Unlock()
	if in.ns.gen != gen || in.ns.pending[ns] != buf {
		// A full relist happened meanwhile and recomputed membership.
		return nil
	}
	delete(in.ns.pending, ns)
	if !in.nsMatches(ns) {
		// Relabelled back while we listed; a queued change follows.
		in.ns.admitted[ns] = false
		return nil
	}
	return in.replaceNamespaceLocked(ns, mergeNamespace(objs, buf), true)
}

// mergeNamespace combines a namespace's LIST with the events buffered while
// it was read: per key, the newer state wins; a newer deletion removes.
func mergeNamespace(listed []*store.Object, buf *nsBuffer) []*store.Object {
	out := make([]*store.Object, 0, len(listed)+len(buf.events))
	seen := make(map[string]bool, len(listed))
	for _, o := range listed {
		seen[o.Key] = true
		ev, ok := buf.events[o.Key]
		switch {
		case !ok || ev.RV <= o.RV:
			out = append(out, o)
		case ev.Type != store.Deleted:
			out = append(out, ev.Object)
		}
	}
	for k, ev := range buf.events {
		if !seen[k] && ev.Type != store.Deleted {
			out = append(out, ev.Object)
		}
	}
	return out
}

// replaceNamespaceLocked sets the store's content for ns to objs (nil: none)
// at the applied RV and publishes the difference.
func (in *Ingester) replaceNamespaceLocked(ns string, objs []*store.Object, admitted bool) error {
	var all []*store.Object
	if _, err := in.opts.Store.Scan(store.ListRequest{}, func(o *store.Object) bool {
		if o.Namespace != ns {
			all = append(all, o)
		}
		return true
	}); err != nil {
		return err
	}
	all = append(all, objs...)
	rv := in.applied
	events, err := in.opts.Store.Replace(all, rv)
	if err != nil {
		return err
	}
	in.ns.admitted[ns] = admitted
	in.publishRelistLocked(events, rv)
	in.opts.Log.V(1).Info("namespace membership changed", "resource", in.res, "namespace", ns, "admitted", admitted, "objects", len(objs), "changes", len(events), "rv", rv)
	return nil
}

// listNamespace reads one namespace of the resource with a consistent,
// paginated LIST (the resource's label selector applies).
func (in *Ingester) listNamespace(ctx context.Context, ns string) ([]*store.Object, uint64, error) {
	return in.listAll(ctx, in.opts.Host+namespacedPath(in.opts.Resource, ns))
}

// namespacedPath is the collection path of res inside namespace ns.
func namespacedPath(res Resource, ns string) string {
	base := "/apis/" + res.GVR.Group + "/" + res.GVR.Version
	if res.GVR.Group == "" {
		base = "/api/" + res.GVR.Version
	}
	return base + "/namespaces/" + url.PathEscape(ns) + "/" + res.GVR.Resource
}

// publishRelistLocked hands a Replace's difference to downstream watchers
// the way replace does.
func (in *Ingester) publishRelistLocked(events []store.Event, rv uint64) {
	if in.opts.OnRelist != nil {
		in.opts.OnRelist(events, rv)
	} else if in.opts.OnEvents != nil && len(events) > 0 {
		in.opts.OnEvents(events)
	}
}

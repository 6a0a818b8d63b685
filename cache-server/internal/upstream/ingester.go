// Package upstream ingests one resource from the apiserver into a store:
// watch-list (falling back to LIST+WATCH), resume from the last RV, relist on
// 410 with the difference applied as events, and the two primitives a
// consistent read needs — the apiserver's current RV and proof that the
// cache has applied the stream up to it.
package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/coalesce"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Options configure an Ingester.
type Options struct {
	Resource Resource
	// Host is the apiserver base URL; Client carries its credentials.
	Host   string
	Client *http.Client
	Store  *store.Store
	// Fields computes field-selector values for the resource (may be nil).
	Fields  FieldsFunc
	Metrics *metrics.Metrics
	Log     logr.Logger
	// OnEvents receives every change applied to the store, in RV order
	// (watch fan-out). May be nil.
	OnEvents func([]store.Event)
	// OnRelist, when set, receives a relist's difference (possibly empty)
	// and its RV instead of OnEvents; the first call is the initial load.
	OnRelist func(events []store.Event, rv uint64)
	// OnProgress receives upstream progress without changes (bookmarks).
	OnProgress func(rv uint64)
	// OnInitialLoad, when set, is told once that the first full state of
	// the resource is in the store (e.g. memrelease.Releaser.Loaded).
	OnInitialLoad func(objects int)
	// Namespaces, when set, keeps only objects in namespaces matching the
	// profile's namespaceSelector (see NamespaceFilter).
	Namespaces *NamespaceFilter
	// Owns, when set, keeps only the objects whose key it accepts (a
	// fleet's shard keeps its hash shards). Changes to other keys still
	// advance the applied RV, as progress: every shard sees every upstream
	// RV, which is what lets the front read all shards at one RV.
	Owns func(key string) bool
	// ContentHashes sets each stored object's ContentHash: once per
	// change here, instead of once per LIST at every front that reads it
	// from this shard. Only shards send it; a standalone tier would hash
	// every change for nothing.
	ContentHashes bool
}

// Ingester keeps a store in sync with one upstream resource.
type Ingester struct {
	opts Options
	res  string // metric label

	// gate serialises everything that changes the store: the main stream,
	// progress probes and relists all deliver in-order streams, and an
	// event at or below applied has already been applied from another one.
	gate     sync.Mutex
	applied  uint64
	changed  chan struct{} // closed and replaced when applied advances
	synced   chan struct{}
	isSynced bool

	rvFetch *coalesce.Runs
	// rvFetchByList: the apiserver refused the watch-list RV fetch (its
	// WatchList feature is off); fetch with a LIST of the same key.
	rvFetchByList atomic.Bool
	// probe re-reads a bookmarkless resource for waiting reads (coalesced);
	// prober runs the progress probes of a resource with a watch cache.
	probe  *coalesce.Runs
	prober prober
	// life ends when Run returns: the prober's goroutines end with it.
	life     context.Context
	stopLife context.CancelFunc
	// bookmarkless: the apiserver serves this resource without a watch
	// cache, so its watches carry no progress bookmarks. Starts from the
	// apiserver's defaults (UncachedByDefault) and is corrected by what
	// the streams show: any periodic bookmark clears it, a probe that
	// should have got one and did not sets it.
	bookmarkless atomic.Bool
	// sawBookmark: a bookmark other than a watch-list's initial-events-end
	// arrived (periodic, or on a probe): the apiserver serves this resource
	// from its watch cache. probeMisses counts progress probes in a row
	// that ended without one (bookmarklessAfter).
	sawBookmark atomic.Bool
	probeMisses atomic.Int32
	// latestRV is the newest RV the apiserver reported (RV fetches).
	latestRV atomic.Uint64

	// ns is the namespace filter's state (guarded by gate); nsList reads
	// one namespace (a field so tests can replace it).
	ns     nsState
	nsList func(ctx context.Context, ns string) ([]*store.Object, uint64, error)
}

// New returns an ingester; call Run to start it.
func New(opts Options) *Ingester {
	in := &Ingester{opts: opts, res: opts.Resource.String(), changed: make(chan struct{}), synced: make(chan struct{})}
	in.rvFetch = coalesce.New(in.fetchCurrentRV)
	in.probe = coalesce.New(in.runRelistProbe)
	in.life, in.stopLife = context.WithCancel(context.Background())
	in.prober.cadence, in.prober.linger = probeCadence, probeLinger
	in.bookmarkless.Store(UncachedByDefault(opts.Resource.GVR.GroupResource()))
	in.ns = nsState{admitted: map[string]bool{}, pending: map[string]*nsBuffer{}, queue: make(chan string, 1024)}
	in.nsList = in.listNamespace
	return in
}

// UpstreamUncached reports whether the apiserver serves this resource
// without a watch cache (and so honours limit on resourceVersion=0 lists).
func (in *Ingester) UpstreamUncached() bool { return in.bookmarkless.Load() }

// UncachedByDefault lists the resources kube-apiserver serves without a
// watch cache unless --watch-cache-sizes says otherwise (its default
// storage factory sets their cache size to 0): events, both groups.
func UncachedByDefault(gr schema.GroupResource) bool {
	return gr.Resource == "events" && (gr.Group == "" || gr.Group == "events.k8s.io")
}

// Resource is what this ingester ingests.
func (in *Ingester) Resource() Resource { return in.opts.Resource }

// Store is where it ingests into.
func (in *Ingester) Store() *store.Store { return in.opts.Store }

// Synced is closed once the initial state has been loaded.
func (in *Ingester) Synced() <-chan struct{} { return in.synced }

// AppliedRV is the RV up to which the upstream stream has been applied.
func (in *Ingester) AppliedRV() uint64 {
	in.gate.Lock()
	defer in.gate.Unlock()
	return in.applied
}

// Run ingests until ctx is done.
func (in *Ingester) Run(ctx context.Context) {
	defer in.stopLife()
	log := in.opts.Log.WithValues("resource", in.res)
	if f := in.opts.Namespaces; f != nil {
		f.Namespaces.Subscribe(in.enqueueNamespace)
		select {
		case <-ctx.Done():
			return
		case <-f.Namespaces.Synced():
		}
		go in.runNamespaceSync(ctx)
	}
	needList, reason := true, "startup"
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		var err error
		if needList {
			in.opts.Metrics.UpstreamRelists.WithLabelValues(in.res, reason).Inc()
			err = in.relistAndWatch(ctx)
		} else {
			err = in.watchFrom(ctx, in.AppliedRV())
		}
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil || errors.Is(err, errStreamEnded) || errors.Is(err, io.ErrUnexpectedEOF):
			// A watch timed out or the connection closed: resume from the
			// last applied RV, nothing is lost.
			needList = false
			backoff = 100 * time.Millisecond
			continue
		case isGone(err):
			log.Info("resourceVersion expired upstream; relisting", "appliedRV", in.AppliedRV(), "err", err)
			needList, reason = true, "expired"
			continue
		default:
			log.Error(err, "upstream stream failed; retrying", "backoff", backoff)
			// Once synced, resume from the last applied RV (a 410 then
			// relists, counted as expired). needList used to stay as the
			// previous attempt left it: a connection reset on the first
			// stream (the start-up relist's) re-read the whole resource
			// again instead of resuming, counted as "startup".
			needList = !in.isSyncedNow()
			if needList {
				reason = "error"
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}

func (in *Ingester) isSyncedNow() bool {
	in.gate.Lock()
	defer in.gate.Unlock()
	return in.isSynced
}

// relistAndWatch loads the full state and then keeps watching. It prefers a
// watch-list stream (one request, the state arrives as ADDED events and a
// bookmark, then live events on the same stream) and falls back to a
// paginated LIST followed by a WATCH when the apiserver refuses it.
func (in *Ingester) relistAndWatch(ctx context.Context) error {
	objs, rv, s, err := in.readInitialState(ctx, watchTimeout())
	if watchListRefused(err) {
		in.opts.Log.Info("the apiserver refused watch-list (WatchList feature off?); loading with LIST+WATCH", "resource", in.res, "err", err)
		in.opts.Metrics.UpstreamWatchListFallbacks.WithLabelValues(in.res).Inc()
		return in.listThenWatch(ctx)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	if err := in.replace(objs, rv); err != nil {
		return err
	}
	return in.consume(ctx, s)
}

// readInitialState opens a consistent watch-list and reads its initial
// events up to the initial-events-end bookmark. The open stream is returned
// so the caller can keep consuming live events from it.
func (in *Ingester) readInitialState(ctx context.Context, timeoutSeconds string) ([]*store.Object, uint64, *eventStream, error) {
	q := url.Values{}
	q.Set("sendInitialEvents", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersionMatch", "NotOlderThan")
	q.Set("timeoutSeconds", timeoutSeconds)
	s, err := openWatch(ctx, in.opts.Client, in.opts.Host, in.opts.Resource, q)
	if err != nil {
		return nil, 0, nil, err
	}
	var initial []*store.Object
	for {
		ev, err := s.next()
		if err != nil {
			s.Close()
			return nil, 0, nil, fmt.Errorf("watch-list of %s ended before its initial-events-end bookmark: %w", in.res, err)
		}
		switch ev.Type {
		case "ADDED":
			o, err := in.decode(ev.Object)
			if err != nil {
				s.Close()
				return nil, 0, nil, err
			}
			initial = append(initial, o)
		case "BOOKMARK":
			rv, end, err := bookmarkInfo(ev.Object)
			if err != nil {
				s.Close()
				return nil, 0, nil, err
			}
			if end {
				return initial, rv, s, nil
			}
		case "ERROR":
			s.Close()
			return nil, 0, nil, eventStatus(ev.Object)
		default:
			s.Close()
			return nil, 0, nil, fmt.Errorf("unexpected %s event during watch-list of %s", ev.Type, in.res)
		}
	}
}

// watchListRefused recognizes an apiserver that does not serve watch-list:
// with the WatchList feature off it rejects sendInitialEvents as invalid.
func watchListRefused(err error) bool {
	return apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)
}

// listThenWatch is the pre-watch-list protocol: LIST in pages of 500 at
// one RV, then WATCH from it.
func (in *Ingester) listThenWatch(ctx context.Context) error {
	objs, rv, err := in.listAll(ctx, in.opts.Host+in.opts.Resource.Path())
	if err != nil {
		return err
	}
	if err := in.replace(objs, rv); err != nil {
		return err
	}
	return in.watchFrom(ctx, rv)
}

// listAll reads the collection at URL u with a consistent LIST in pages of
// 500 (one snapshot: the continue tokens keep the first page's RV).
func (in *Ingester) listAll(ctx context.Context, u string) ([]*store.Object, uint64, error) {
	var objs []*store.Object
	cont := ""
	for {
		q := url.Values{}
		q.Set("limit", "500")
		if cont != "" {
			q.Set("continue", cont)
		}
		page, err := getList(ctx, in.opts.Client, u, in.opts.Resource, q)
		if err != nil {
			return nil, 0, err
		}
		for _, item := range page.Items {
			o, err := in.decode(withTypeMeta(item, in.opts.Resource))
			if err != nil {
				return nil, 0, err
			}
			objs = append(objs, o)
		}
		if cont = page.Metadata.Continue; cont == "" {
			rv, err := ParseRV(page.Metadata.ResourceVersion)
			return objs, rv, err
		}
	}
}

// decode is DecodeObject of a copy of raw (a view into a stream's
// buffer). An object whose key Owns
// refuses is not decoded nor copied: it comes back with only its key and
// RV, which is all the callers look at before dropping it (progress).
func (in *Ingester) decode(raw []byte) (*store.Object, error) {
	if in.opts.Owns != nil {
		if ns, name, rv, ok := objectKey(raw); ok {
			if key := keyhash.Key(ns, name); !in.opts.Owns(key) {
				parsed, err := ParseRV(rv)
				if err != nil {
					return nil, fmt.Errorf("object %s: %w", key, err)
				}
				return &store.Object{Key: key, RV: parsed}, nil
			}
		}
	}
	o, err := DecodeObject(bytes.Clone(raw), in.opts.Fields)
	if err == nil && in.opts.ContentHashes {
		o.ContentHash = store.HashContent(o.Raw)
	}
	return o, err
}

// withTypeMeta gives a LIST item the kind and apiVersion that watch events
// carry (typed lists omit them per item), so stored bytes do not depend on
// which protocol loaded them.
func withTypeMeta(item []byte, res Resource) []byte {
	if bytes.HasPrefix(item, []byte(`{"kind":`)) || bytes.HasPrefix(item, []byte(`{"apiVersion":`)) {
		return item
	}
	gv := res.GVR.GroupVersion().String()
	prefix := `{"kind":` + strconv.Quote(res.Kind) + `,"apiVersion":` + strconv.Quote(gv)
	if len(item) > 2 {
		prefix += ","
	}
	return append([]byte(prefix), item[1:]...)
}

// watchFrom watches from rv and applies events until the stream ends.
func (in *Ingester) watchFrom(ctx context.Context, rv uint64) error {
	q := url.Values{}
	q.Set("resourceVersion", strconv.FormatUint(rv, 10))
	q.Set("allowWatchBookmarks", "true")
	q.Set("timeoutSeconds", watchTimeout())
	s, err := openWatch(ctx, in.opts.Client, in.opts.Host, in.opts.Resource, q)
	if err != nil {
		return err
	}
	defer s.Close()
	return in.consume(ctx, s)
}

// consume applies a live stream's events until it ends.
func (in *Ingester) consume(ctx context.Context, s *eventStream) error {
	for {
		ev, err := s.next()
		if err == io.EOF {
			return errStreamEnded
		}
		if err != nil {
			return err
		}
		if err := in.handle(ev); err != nil {
			return err
		}
	}
}

// handle applies one live event (from the main stream or a probe).
func (in *Ingester) handle(ev rawEvent) error {
	_, err := in.handleRV(ev)
	return err
}

// handleRV is handle, also returning the event's RV.
func (in *Ingester) handleRV(ev rawEvent) (uint64, error) {
	in.opts.Metrics.UpstreamEvents.WithLabelValues(in.res, ev.Type).Inc()
	var t store.EventType
	switch ev.Type {
	case "ADDED":
		t = store.Added
	case "MODIFIED":
		t = store.Modified
	case "DELETED":
		t = store.Deleted
	case "BOOKMARK":
		rv, initialEnd, err := bookmarkInfo(ev.Object)
		if err != nil {
			return 0, err
		}
		if !initialEnd {
			in.sawBookmark.Store(true)
			if in.bookmarkless.Swap(false) {
				in.opts.Log.Info("upstream sends bookmarks for this resource after all", "resource", in.res)
			}
		}
		in.opts.Metrics.UpstreamLatestRV.WithLabelValues(in.res).Set(float64(rv))
		in.markProgress(rv)
		return rv, nil
	case "ERROR":
		return 0, eventStatus(ev.Object)
	default:
		return 0, fmt.Errorf("unknown watch event type %q", ev.Type)
	}
	o, err := in.decode(ev.Object)
	if err != nil {
		return 0, err
	}
	if in.opts.Owns != nil && !in.opts.Owns(o.Key) {
		in.markProgress(o.RV)
		return o.RV, nil
	}
	return o.RV, in.apply(store.Event{Type: t, Object: o, RV: o.RV})
}

func (in *Ingester) apply(ev store.Event) error {
	in.gate.Lock()
	defer in.gate.Unlock()
	if ev.RV <= in.applied {
		return nil // already applied from another stream
	}
	if in.filterEventLocked(ev) {
		return nil // outside the namespaceSelector
	}
	if err := in.opts.Store.Apply(ev); err != nil {
		return err
	}
	in.advanceLocked(ev.RV)
	if in.opts.OnEvents != nil {
		in.opts.OnEvents([]store.Event{ev})
	}
	return nil
}

func (in *Ingester) markProgress(rv uint64) {
	in.gate.Lock()
	defer in.gate.Unlock()
	if rv <= in.applied {
		return
	}
	in.opts.Store.MarkProgress(rv)
	in.advanceLocked(rv)
	if in.opts.OnProgress != nil {
		in.opts.OnProgress(rv)
	}
}

// replace installs a full state read at rv (start-up or relist after 410).
// The difference to what was cached becomes events, so watchers see deletes
// and updates instead of being disconnected.
func (in *Ingester) replace(objs []*store.Object, rv uint64) error {
	in.gate.Lock()
	defer in.gate.Unlock()
	if rv < in.applied {
		// A consistent read cannot be older than what we applied from the
		// same apiserver; refuse rather than move the cache backwards.
		return fmt.Errorf("relist of %s returned RV %d older than applied RV %d", in.res, rv, in.applied)
	}
	objs = in.filterReplaceLocked(in.owned(objs))
	events, err := in.opts.Store.Replace(objs, rv)
	if err != nil {
		return err
	}
	in.advanceLocked(rv)
	if in.opts.OnRelist != nil {
		in.opts.OnRelist(events, rv)
	} else if in.opts.OnEvents != nil && len(events) > 0 {
		in.opts.OnEvents(events)
	}
	if !in.isSynced {
		in.isSynced = true
		close(in.synced)
		if in.opts.OnInitialLoad != nil {
			in.opts.OnInitialLoad(len(objs))
		}
	}
	in.opts.Log.V(1).Info("loaded state", "resource", in.res, "objects", len(objs), "rv", rv, "changes", len(events))
	return nil
}

// replaceIfNewer is replace for a progress relist: when the main stream
// already got past rv there is nothing to install — and nothing to prove,
// since it delivered every event up to a later RV in order.
func (in *Ingester) replaceIfNewer(objs []*store.Object, rv uint64) error {
	in.gate.Lock()
	newer := rv >= in.applied
	in.gate.Unlock()
	if !newer {
		return nil
	}
	err := in.replace(objs, rv)
	if err != nil && in.AppliedRV() > rv {
		return nil // lost a race with the main stream; see above
	}
	return err
}

// owned is objs without the keys Owns refuses (all of them without Owns).
func (in *Ingester) owned(objs []*store.Object) []*store.Object {
	if in.opts.Owns == nil {
		return objs
	}
	out := objs[:0:0]
	for _, o := range objs {
		if in.opts.Owns(o.Key) {
			out = append(out, o)
		}
	}
	return out
}

func (in *Ingester) advanceLocked(rv uint64) {
	in.applied = rv
	in.opts.Metrics.UpstreamRV.WithLabelValues(in.res).Set(float64(rv))
	close(in.changed)
	in.changed = make(chan struct{})
}

// watchTimeout spreads long watches between 5 and 10 minutes, as client-go's
// reflector does, so many tiers do not reconnect in lockstep.
func watchTimeout() string {
	return strconv.Itoa(300 + rand.IntN(300))
}

// Package shardserver is a fleet shard's API for its fronts: pages and
// scans of its hash shards at an exact RV, single objects, the stream of
// its changes with watermarks, and freshness (the apiserver's current RV,
// waits until an RV is applied). Bodies are shardwire records. It is not a
// Kubernetes API: the fronts serve that, merging what the shards answer.
//
// Every shard sees every upstream RV (changes to keys it does not own are
// progress), so all shards can be read at one RV and their streams merged
// in RV order by watermark.
package shardserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/ingest"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// Server serves one shard's resources.
type Server struct {
	resources map[string]ingest.Resource
	// holds is the hash shards this replica keeps: requests for another
	// range are refused (shardwire.ParamHashShards).
	holds   shardwire.HashRange
	metrics *metrics.Metrics
	// seatCPU learns the replica's CPU per seat's worth of the lists it
	// serves, sent to the fronts with its sizes.
	seatCPU *seatcpu.Learner
	log     logr.Logger
	pools   *shardwire.Pools
	// bufs pools the write buffers of compressed lists (an encoder writes
	// each block, a few KB, on its own).
	bufs sync.Pool
	// bulk lowers the lists of fronts' bulk requests
	// (shardwire.ParamBulkNice) while it has a slot.
	bulk *bulkthread.Slots
}

// New returns the handler of a replica that holds the hash shards holds;
// seatCPU (which the caller runs) learns from the lists it serves; bulk
// bounds the lists of fronts' bulk requests it runs lowered at once.
func New(resources []ingest.Resource, holds shardwire.HashRange, seatCPU *seatcpu.Learner, bulk *bulkthread.Slots, m *metrics.Metrics, log logr.Logger) *Server {
	s := &Server{resources: map[string]ingest.Resource{}, holds: holds, metrics: m, seatCPU: seatCPU, bulk: bulk, log: log, pools: shardwire.NewPools(),
		bufs: sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 32<<10) }}}
	for _, r := range resources {
		s.resources[shardwire.ResourceID(r.Entry.Resource.GVR)] = r
	}
	return s
}

// ServeHTTP routes a shard request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var serve func(context.Context, *shardwire.Writer, ingest.Resource, *http.Request) error
	verb := ""
	switch r.URL.Path {
	case shardwire.PathList:
		serve, verb = s.list, "list"
	case shardwire.PathWatch:
		serve, verb = s.watch, "watch"
	case shardwire.PathCurrentRV:
		serve, verb = s.currentRV, "currentrv"
	case shardwire.PathWait:
		serve, verb = s.wait, "wait"
	default:
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	id := q.Get("resource")
	res, ok := s.resources[id]
	label := "unknown" // not the caller's string: bounded label values
	if ok {
		label = res.Entry.Resource.String() // as every other metric names it
	}
	if !s.directedHere(w, q, verb, label) {
		return
	}
	w.Header().Set("Content-Type", shardwire.ContentType)
	var body io.Writer = flushWriter{w, http.NewResponseController(w)}
	if verb == "list" {
		// A list is one bulk answer, read as it comes: written in large
		// pieces (each flush was an HTTP chunk, a TLS record and a
		// write(2)), compressed for a front that asks
		// (shardwire.EncodingS2).
		body = w
		if shardwire.AcceptsS2(r) {
			w.Header().Set("Content-Encoding", shardwire.EncodingS2)
			bw := s.bufs.Get().(*bufio.Writer)
			bw.Reset(w)
			enc := s.pools.Encoder(bw)
			defer func() {
				_ = enc.Close()
				_ = bw.Flush()
				bw.Reset(nil)
				s.bufs.Put(bw)
			}()
			body = enc
		}
	}
	w.WriteHeader(http.StatusOK)
	out := s.pools.Writer(body)
	defer s.pools.PutWriter(out) // flushed at the end of ServeHTTP
	var err error
	if !ok {
		err = apierrors.NewNotFound(schema.GroupResource{Group: "cachetier.io", Resource: "cached-resources"}, id)
	} else {
		err = s.synced(r.Context(), res, verb == "watch")
		nice := 0
		if err == nil && verb == "list" {
			nice, err = shardwire.ParseBulkNice(q)
		}
		if err == nil {
			s.bulk.Counted(nice, s.metrics.BulkRequests, s.log, func() {
				err = serve(r.Context(), out, res, r)
			})
		}
	}
	outcome := "ok"
	if err != nil && r.Context().Err() == nil {
		outcome = "error"
		_ = out.Error(err)
		s.log.V(1).Info("shard request failed", "verb", verb, "resource", id, "query", r.URL.RawQuery, "err", err.Error())
	}
	_ = out.Flush()
	if verb == "list" {
		// A shard walks about what it writes: the fronts' selectors and
		// index narrow its scans before it writes an item.
		s.seatCPU.Did(seatcpu.List, seatcpu.Work(out.Written()))
	}
	s.metrics.ShardRequests.WithLabelValues(verb, label, outcome).Inc()
	s.metrics.ShardRequestDuration.WithLabelValues(verb, label).Observe(time.Since(start).Seconds())
}

// directedHere answers a request for hash shards other than the ones held
// (400 for a malformed range, 421 for another one) and says whether to
// serve it. A front whose topology is older or newer than this replica's
// range (the shard count is changing) tries the shard's other replicas.
func (s *Server) directedHere(w http.ResponseWriter, q url.Values, verb, label string) bool {
	want, ok, err := shardwire.ParseHashRange(q)
	if err == nil && (!ok || want == s.holds) {
		return true
	}
	outcome := "error"
	var st metav1.Status
	if err != nil {
		st = err.(apierrors.APIStatus).Status() // ParseHashRange's 400
	} else {
		outcome = "misdirected"
		st = metav1.Status{Status: metav1.StatusFailure, Code: shardwire.StatusMisdirected,
			Message: fmt.Sprintf("this replica holds hash shards %s, not %s", s.holds, want)}
		s.log.V(1).Info("refused a request for other hash shards", "verb", verb, "holds", s.holds.String(), "asked", want.String())
	}
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	body, _ := json.Marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(body)
	s.metrics.ShardRequests.WithLabelValues(verb, label, outcome).Inc()
	return false
}

// synced answers 429 while the resource's initial load is not done, as
// the apiserver's cacher does while it initializes — at once for reads, so
// the front's client retries instead of waiting; a change stream waits for
// the load (the front opens it once and keeps it).
func (s *Server) synced(ctx context.Context, res ingest.Resource, wait bool) error {
	if !wait {
		select {
		case <-res.Ingester.Synced():
			return nil
		default:
			return apierrors.NewTooManyRequests("storage is (re)initializing", 1)
		}
	}
	select {
	case <-res.Ingester.Synced():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// list answers a page (limit > 0), a whole scan (limit 0) or one object
// (key) at snapshot rv (0 = latest), after waiting until rv is applied.
func (s *Server) list(ctx context.Context, out *shardwire.Writer, res ingest.Resource, r *http.Request) error {
	q := r.URL.Query()
	rv, err := uintParam(q.Get("rv"))
	if err != nil {
		return err
	}
	limit, err := uintParam(q.Get("limit"))
	if err != nil {
		return err
	}
	if rv > 0 {
		if err := res.Ingester.WaitFresh(ctx, rv); err != nil {
			return &store.TooLargeResourceVersionError{RV: rv, Current: res.Ingester.AppliedRV(), Err: err}
		}
	}
	return ListStore(out, res.Ingester.Store(), q, rv, limit)
}

// ListStore answers a list request's query q from st at snapshot rv (0 =
// latest), limit items (0 = all): the part of list after the freshness
// wait, for any store (the handler's, and tests of the fronts' merge).
func ListStore(out *shardwire.Writer, st *store.Store, q url.Values, rv, limit uint64) error {
	if shardwire.WantsContentHashes(q) {
		out.SendContentHashes()
	}
	if key := q.Get("key"); key != "" {
		o, snapRV, err := st.Get(key, rv)
		if err != nil {
			return err
		}
		if o != nil {
			if err := out.Item(o); err != nil {
				return err
			}
		}
		return out.End(shardwire.Header{RV: snapRV})
	}
	match, fs, err := matcher(q.Get("labelSelector"), q.Get("fieldSelector"))
	if err != nil {
		return err
	}
	index, byIndex, err := shardwire.ParseIndex(q)
	if err != nil {
		return err
	}
	if index.Field != "" {
		// The index narrows the read: it must be the selector's own
		// equality, or the page would lose objects the selector matches.
		if v, ok := fs.RequiresExactMatch(index.Field); !ok || v != index.Value {
			return apierrors.NewBadRequest(fmt.Sprintf("%s=%s is not an equality of the field selector %q", index.Field, index.Value, fs.String()))
		}
	}
	req := store.ListRequest{SnapshotRV: rv, Namespace: q.Get("namespace"), StartKeyExclusive: q.Get("after"), Limit: int64(limit), Match: match,
		SkipCount: q.Get("count") == "false", Index: index, ContinueByIndex: byIndex}
	if limit == 0 {
		var werr error
		snapRV, err := st.Scan(req, func(o *store.Object) bool {
			werr = out.Item(o)
			return werr == nil
		})
		if err != nil {
			return err
		}
		if werr != nil {
			return werr
		}
		return out.End(shardwire.Header{RV: snapRV})
	}
	page, err := st.List(req)
	if err != nil {
		return err
	}
	for _, o := range page.Items {
		if err := out.Item(o); err != nil {
			return err
		}
	}
	end := shardwire.Header{RV: page.RV, Continue: page.ContinueKey, Remaining: page.RemainingItemCount}
	if page.ContinueKey == "" {
		// By the page's continuation rule: the last key with the
		// index's value when the front merges by the apiserver's index.
		req.SnapshotRV = page.RV
		if end.LastKey, err = st.LastKey(req); err != nil {
			return err
		}
	}
	return out.End(end)
}

// watch streams every change after rv (0 = from now) with its previous
// state, and watermarks, until the front goes away. The first record of a
// watch from now is the watermark it starts after.
func (s *Server) watch(ctx context.Context, out *shardwire.Writer, res ingest.Resource, r *http.Request) error {
	from, err := uintParam(r.URL.Query().Get("rv"))
	if err != nil {
		return err
	}
	watcher, err := res.Hub.Watch(watch.Request{From: from, NoLagLimit: true})
	if err != nil {
		return err
	}
	defer watcher.Stop()
	// The front estimates reads' costs from the shards' sizes: they ride
	// on a watermark every sizesEvery (a walk of a few maps per shard).
	var sizesSent time.Time
	watermark := func(rv uint64) error {
		if time.Since(sizesSent) < sizesEvery {
			return out.Watermark(rv, res.Ingester.UpstreamUncached())
		}
		sizesSent = time.Now()
		return out.WatermarkWithSizes(rv, res.Ingester.UpstreamUncached(), res.Ingester.Store().Sizes(), s.seatCPU.SeatCPU(seatcpu.List))
	}
	if from == 0 {
		if err := watermark(watcher.SnapshotRV); err != nil {
			return err
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	var evs []watch.Event
	for {
		var wm uint64
		evs, wm, err = watcher.Follow(ctx.Done(), evs[:0])
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		for _, e := range evs {
			if err := out.Event(e.Type.String(), e.RV, e.Object, e.Prev); err != nil {
				return err
			}
		}
		if wm > 0 {
			if err := watermark(wm); err != nil {
				return err
			}
		}
		if err := out.Flush(); err != nil {
			return err
		}
		if len(evs) == 0 {
			// Only progress: let more of it (and events) gather.
			select {
			case <-time.After(watch.FollowPause):
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// sizesEvery is how often a change stream carries the shard's sizes.
const sizesEvery = 5 * time.Second

// currentRV answers the apiserver's current RV for the resource, fetched
// after the request arrived (coalesced with concurrent fetches).
func (s *Server) currentRV(ctx context.Context, out *shardwire.Writer, res ingest.Resource, _ *http.Request) error {
	rv, err := res.Ingester.CurrentRV(ctx)
	if err != nil {
		return apierrors.NewServiceUnavailable("cannot read the apiserver's current resourceVersion: " + err.Error())
	}
	return out.Watermark(rv, res.Ingester.UpstreamUncached())
}

// wait returns once rv is applied (the shard proves its progress to the
// apiserver if its stream is quiet), answering the applied RV.
func (s *Server) wait(ctx context.Context, out *shardwire.Writer, res ingest.Resource, r *http.Request) error {
	rv, err := uintParam(r.URL.Query().Get("rv"))
	if err != nil {
		return err
	}
	if err := res.Ingester.WaitFresh(ctx, rv); err != nil {
		return &store.TooLargeResourceVersionError{RV: rv, Current: res.Ingester.AppliedRV(), Err: err}
	}
	return out.Watermark(res.Ingester.AppliedRV(), res.Ingester.UpstreamUncached())
}

// matcher builds the selector a front sent in canonical text form (field
// labels already converted for the resource), and returns the field
// selector parsed.
func matcher(label, field string) (func(*store.Object) bool, fields.Selector, error) {
	ls, err := labels.Parse(label)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest("labelSelector: " + err.Error())
	}
	fs, err := fields.ParseSelector(field)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest("fieldSelector: " + err.Error())
	}
	if label == "" && field == "" {
		return nil, fs, nil
	}
	return func(o *store.Object) bool {
		return ls.Matches(labels.Set(o.Labels)) && fs.Matches(o.FieldSet())
	}, fs, nil
}

func uintParam(v string) (uint64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest("invalid number " + strconv.Quote(v))
	}
	return n, nil
}

// flushWriter flushes the HTTP response after every write the shardwire
// buffer makes (it writes in 64 KiB pieces and on Flush), so a front sees
// each batch of events as soon as it is complete.
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

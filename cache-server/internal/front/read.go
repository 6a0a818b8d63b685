package front

import (
	"context"
	"errors"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/continuetoken"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/listparams"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

func (s *Server) serveGet(w http.ResponseWriter, r *http.Request, res *resource, info *request.RequestInfo) int {
	errEnc := errorEncoding(r.Header.Get("Accept"))
	enc, err := negotiateFor(res, r.Header.Get("Accept"), false)
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	p, err := listparams.Parse(r.URL.Query(), listparams.Get, listparams.Options{Namespace: info.Namespace, Name: info.Name})
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	if _, err := s.ready(r.Context(), res, p.Read); err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	ns := info.Namespace
	if !res.APIResource.Namespaced {
		ns = ""
	}
	o, _, err := res.Source.Get(keyhash.Key(ns, info.Name), 0)
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	if o == nil {
		return writeErrorAs(w, errEnc, apierrors.NewNotFound(res.GVR.GroupResource(), info.Name))
	}
	return writeObject(w, r, res, enc, o)
}

func (s *Server) serveList(w http.ResponseWriter, r *http.Request, res *resource, info *request.RequestInfo) int {
	errEnc := errorEncoding(r.Header.Get("Accept"))
	enc, err := negotiateFor(res, r.Header.Get("Accept"), true)
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	ns := info.Namespace
	if !res.APIResource.Namespaced {
		ns = ""
	}
	p, err := listparams.Parse(r.URL.Query(), listparams.List, listparams.Options{
		Namespace: ns, ConvertFieldLabel: res.Entry.Fields.ConvertFieldLabel,
	})
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	snapshotRV, err := s.ready(r.Context(), res, p.Read)
	if err != nil {
		return writeErrorAs(w, errEnc, err)
	}
	limit := p.Limit
	if p.ResourceVersion == "0" && res.Source.UpstreamUncached() && p.ListOptions.Limit > 0 {
		// The watch cache ignores limit on resourceVersion=0; a resource
		// the apiserver serves from etcd (no watch cache) honours it.
		limit = p.ListOptions.Limit
	}
	req := store.ListRequest{
		SnapshotRV:        snapshotRV,
		Namespace:         ns,
		StartKeyExclusive: p.ContinueKey,
		Limit:             limit,
		Match:             p.Matcher(),
		Selector:          p.SelectorText(),
		BulkNice:          bulkthread.Nice(r.Context()),
	}
	if p.ContinueKey != "" && p.ContinueRemaining >= 0 && snapshotRV != 0 {
		req.RemainingAfterStart = &p.ContinueRemaining
	}
	req.Index, req.ContinueByIndex = p.ListIndex(res.Entry.FieldIndexes, res.Entry.Fields.APIServerIndexes(), !res.Source.UpstreamUncached())
	if req.Index.Field != "" {
		s.opts.Metrics.IndexedLists.WithLabelValues(res.label, req.Index.Field).Inc()
	}
	if st, ok := res.Source.(ItemStreamer); ok {
		if form := streamFormFor(r, res, enc); form != nil {
			return s.streamList(w, r, res, st, req, form, listRead{ns: ns, continueKey: p.ContinueKey, errEnc: errEnc})
		}
	}
	// A fleet front collects what it cannot stream from the shards
	// (Source.List copies every item; writeList then streams the body
	// from the copies), so such a request holds its items once:
	//   - protobuf (typed and PartialObjectMetadataList): the envelope's
	//     length prefix needs every message before the first byte, and
	//     the items arrive once (a second read at the same RV would read
	//     the shards twice);
	//   - the Tables whose rows depend on each other (FlowSchemas,
	//     StorageClasses: tables.NewList's false) — a cluster's
	//     configuration, a few dozen objects;
	//   - a Table with bad options, answered after the read as the
	//     apiserver answers it.
	result, err := res.Source.List(req)
	if err != nil {
		return writeErrorAs(w, errEnc, listError(err, p.ContinueKey))
	}
	return s.writeList(w, r, res, enc, listMeta(result, ns), result.Items)
}

// listError is the answer to a list read that failed.
func listError(err error, continueKey string) error {
	var expired *store.ExpiredError
	if errors.As(err, &expired) && continueKey != "" {
		// The token's snapshot left the history window: the apiserver's
		// 410 with a token that continues inconsistently at the latest RV.
		return continuetoken.Expired(continueKey)
	}
	return err
}

// listMeta is the metadata of a list read from namespace ns.
func listMeta(result store.ListResult, ns string) metav1.ListMeta {
	meta := metav1.ListMeta{ResourceVersion: formatRV(result.RV), RemainingItemCount: result.RemainingItemCount}
	switch {
	case result.ContinueKey == "":
	case result.RemainingItemCount != nil:
		meta.Continue = continuetoken.EncodeCounted(result.RV, result.ContinueKey, keyhash.NamespacePrefix(ns), *result.RemainingItemCount)
	default:
		meta.Continue = continuetoken.Encode(result.RV, result.ContinueKey)
	}
	return meta
}

// ready waits until the cache can answer a read of the given freshness and
// returns the snapshot RV to read (0 = latest).
//
// Consistent reads never serve data older than the apiserver's state when
// the request arrived: the RV comes from a fetch that started after it, and
// the cache must have applied the stream up to it. A wait that times out is
// the apiserver's 504 "Too large resource version" — never a fallback to the
// apiserver, which under load is the cascading failure KEP-2340 warns of.
func (s *Server) ready(ctx context.Context, res *resource, read listparams.Read) (uint64, error) {
	ing := res.Source
	ctx, cancel := s.freshnessContext(ctx)
	defer cancel()
	select {
	case <-ing.Synced():
	case <-ctx.Done():
		// The apiserver's cacher answers this while it (re)initializes.
		return 0, apierrors.NewTooManyRequests("storage is (re)initializing", 1)
	}
	start := time.Now()
	var target uint64
	switch read.Mode {
	case listparams.ReadAny:
		return 0, nil
	case listparams.ReadConsistent:
		rv, err := ing.CurrentRV(ctx)
		if err != nil {
			s.observeWait(res, start, "rv_fetch_failed")
			if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				// The tier's own RBAC or credentials: retrying will not
				// help, and the operator must see why.
				return 0, apierrors.NewServiceUnavailable("cannot read the apiserver's current resourceVersion: " + err.Error())
			}
			// The apiserver (or, in a fleet, a shard's way to it) does not
			// answer: freshness cannot be proven, which kube-apiserver's
			// watch cache answers with 504 ResourceVersionTooLarge and
			// Retry-After — clients retry it, as they retry the timeout
			// of a wait. Never the cached data instead.
			s.opts.Log.V(1).Info("consistent read refused: the apiserver's current resourceVersion cannot be read", "resource", res.label, "appliedRV", ing.AppliedRV(), "error", err.Error())
			return 0, &store.TooLargeResourceVersionError{RV: 0, Current: ing.AppliedRV(), Err: err}
		}
		target = rv
	case listparams.ReadNotOlderThan, listparams.ReadExact:
		target = read.RV
	}
	if err := ing.WaitFresh(ctx, target); err != nil {
		var tooLarge *store.TooLargeResourceVersionError
		if ctx.Err() == nil && !errors.As(err, &tooLarge) {
			// Not a wait that ran out of time (a fleet's shard that
			// cannot be reached): its own status, not a 504.
			s.observeWait(res, start, "error")
			return 0, err
		}
		s.observeWait(res, start, "timeout")
		s.opts.Log.Info("freshness wait timed out", "resource", res.label, "targetRV", target, "appliedRV", ing.AppliedRV(), "mode", read.Mode.String())
		return 0, &store.TooLargeResourceVersionError{RV: target, Current: ing.AppliedRV(), Err: err}
	}
	s.observeWait(res, start, "ok")
	if read.Mode == listparams.ReadExact {
		return read.RV, nil
	}
	return 0, nil
}

func (s *Server) observeWait(res *resource, start time.Time, outcome string) {
	s.opts.Metrics.FreshnessWait.WithLabelValues(res.label, outcome).Observe(time.Since(start).Seconds())
}

// Package openapi keeps and serves the tier's OpenAPI documents: the
// upstream apiserver's /openapi/v2 and /openapi/v3 documents for the
// group-versions the tier serves (so `kubectl explain` and other OpenAPI
// clients work through the tier and print what they print against the
// apiserver), and, for the aggregator's OpenAPI controllers, documents that
// describe the profile's own API group and nothing else.
//
// Freshness: the upstream's documents change when CRDs (or aggregated APIs)
// change. The keeper polls instead of watching CRDs: one GET of the v3
// discovery document (about 10 KiB; it carries every group-version's
// content hash) and one conditional GET of /openapi/v2 (If-None-Match: a
// 304 without body while nothing changed) per interval, and downloads a
// document only when its hash or ETag changed. Polling needs no RBAC
// beyond what every authenticated user has, sees changes of every source
// (CRDs, aggregated APIs, an apiserver upgrade) the same way, and costs two
// cheap requests per interval whatever the cluster's size.
package openapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/kube-openapi/pkg/handler"
	"k8s.io/kube-openapi/pkg/handler3"
)

// DefaultInterval bounds how long a CRD change takes to reach the tier's
// documents (plus the apiserver's own delay in rebuilding them).
const DefaultInterval = 10 * time.Second

// Options configure a Keeper.
type Options struct {
	// Upstream is the apiserver whose documents are served.
	Upstream *rest.Config
	// Served are the group-versions the tier serves (its discovery).
	Served []schema.GroupVersion
	// Group and Version are the profile's aggregated API group-version
	// (<profile>.cache.cachetier.io, v1alpha1).
	Group, Version string
	// Interval between polls (DefaultInterval when zero).
	Interval time.Duration
	// Refreshes counts polls by result: unchanged, updated, error.
	Refreshes *prometheus.CounterVec
	// LastSuccess is set to the Unix time of the last successful poll.
	LastSuccess prometheus.Gauge
	Log         logr.Logger
}

// Keeper holds the current documents and refreshes them.
type Keeper struct {
	opts   Options
	up     *upstream
	served map[string]bool
	snap   atomic.Pointer[snapshot]
	now    func() time.Time
}

// New builds a keeper; Run loads and refreshes the documents.
func New(opts Options) (*Keeper, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Group == "" || opts.Version == "" {
		return nil, fmt.Errorf("openapi: the aggregated group and version are required")
	}
	up, err := newUpstream(opts.Upstream)
	if err != nil {
		return nil, err
	}
	return &Keeper{opts: opts, up: up, served: servedPaths(opts.Served), now: time.Now}, nil
}

// Run polls until ctx ends. Before the first success it retries every
// second (kubectl explain answers 503 until then).
func (k *Keeper) Run(ctx context.Context) {
	failures := 0
	for {
		err := k.Refresh(ctx)
		wait := k.opts.Interval
		if err != nil {
			failures++
			if k.snap.Load() == nil && wait > time.Second {
				wait = time.Second
			}
			k.opts.Log.Error(err, "refreshing the OpenAPI documents; serving the last good ones", "consecutiveFailures", failures, "retryIn", wait)
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Ready is nil once the documents were loaded.
func (k *Keeper) Ready() error {
	if k.snap.Load() == nil {
		return errors.New("the OpenAPI documents are not loaded from the apiserver yet")
	}
	return nil
}

// Refresh polls the upstream once and swaps in what changed. On error the
// documents served stay the last good ones.
func (k *Keeper) Refresh(ctx context.Context) error {
	changed, err := k.refresh(ctx)
	result := "unchanged"
	switch {
	case err != nil:
		result = "error"
	case len(changed) > 0:
		result = "updated"
	}
	if k.opts.Refreshes != nil {
		k.opts.Refreshes.WithLabelValues(result).Inc()
	}
	if err != nil {
		return err
	}
	if k.opts.LastSuccess != nil {
		k.opts.LastSuccess.Set(float64(k.now().Unix()))
	}
	if len(changed) > 0 {
		s := k.snap.Load()
		bytes := len(s.v2.json) + len(s.v2.proto)
		for _, d := range s.v3 {
			bytes += len(d.json) + len(d.proto)
		}
		k.opts.Log.Info("OpenAPI documents updated", "changed", changed, "v3Paths", slices.Sorted(maps.Keys(s.v3)), "bytes", bytes)
	}
	return nil
}

func (k *Keeper) refresh(ctx context.Context) (changed []string, err error) {
	old := k.snap.Load()
	if old == nil {
		old = &snapshot{}
	}
	next := *old

	disc, err := k.up.get(ctx, "/openapi/v3", mediaJSON, "")
	if err != nil {
		return nil, err
	}
	hashes, err := parseDiscovery(disc.body, k.served)
	if err != nil {
		return nil, err
	}
	next.v3 = map[string]document{}
	for p, h := range hashes {
		if d, ok := old.v3[p]; ok && d.etag == h {
			next.v3[p] = d
			continue
		}
		d, err := k.fetchV3(ctx, p, h)
		if err != nil {
			return nil, err
		}
		next.v3[p] = d
		changed = append(changed, "v3:"+p)
	}
	for p := range old.v3 {
		if _, ok := next.v3[p]; !ok {
			changed = append(changed, "v3:"+p+" (gone)")
		}
	}
	if next.v3Discovery, err = discoveryJSON(next.v3); err != nil {
		return nil, err
	}

	v2, err := k.fetchV2(ctx, old.v2)
	if err != nil {
		return nil, err
	}
	if v2.etag != old.v2.etag {
		changed = append(changed, "v2")
	}
	next.v2 = v2

	if len(changed) > 0 || old.groupV2.json == nil {
		if err := k.buildGroup(&next, old); err != nil {
			return nil, err
		}
	}
	k.snap.Store(&next)
	sort.Strings(changed)
	return changed, nil
}

// fetchV3 downloads one group-version document in both encodings. The
// upstream redirects an outdated hash to the current one, so the document
// got may be newer than hash; it is kept under its own hash.
func (k *Keeper) fetchV3(ctx context.Context, p, hash string) (document, error) {
	j, err := k.up.getDocument(ctx, relativeURL(p, hash), mediaJSON, "")
	if err != nil {
		return document{}, err
	}
	d := document{json: j.body, etag: hashOf(j.body), modified: j.lastModified}
	if j.etag != d.etag {
		return document{}, fmt.Errorf("v3 %s: the ETag %q is not the SHA-512 of the document (%s)", p, j.etag, d.etag)
	}
	pb, err := k.up.getDocument(ctx, relativeURL(p, d.etag), mediaV3ProtoAccept, "")
	if err != nil {
		return document{}, err
	}
	if pb.etag != d.etag {
		return document{}, fmt.Errorf("v3 %s changed while it was downloaded (JSON %s, protobuf %s); next poll", p, d.etag, pb.etag)
	}
	d.proto = pb.body
	return d, nil
}

// fetchV2 polls /openapi/v2 conditionally on old's ETag and downloads both
// encodings when it changed.
func (k *Keeper) fetchV2(ctx context.Context, old document) (document, error) {
	j, err := k.up.getDocument(ctx, "/openapi/v2", mediaJSON, old.etag)
	if err != nil {
		return document{}, err
	}
	if j.status == http.StatusNotModified {
		if old.json == nil {
			return document{}, fmt.Errorf("v2: 304 Not Modified to an unconditional request")
		}
		return old, nil
	}
	d := document{json: j.body, etag: j.etag, modified: j.lastModified}
	if d.etag == "" {
		// kube-openapi always sends one; its rule, should another server not.
		d.etag = hashOf(d.json)
	}
	pb, err := k.up.getDocument(ctx, "/openapi/v2", mediaV2ProtoAccept, "")
	if err != nil {
		return document{}, err
	}
	if pb.etag != "" && pb.etag != d.etag {
		return document{}, fmt.Errorf("v2 changed while it was downloaded (JSON %s, protobuf %s); next poll", d.etag, pb.etag)
	}
	d.proto = pb.body
	return d, nil
}

// buildGroup (re)builds the aggregator's documents from the upstream's
// current ones; a rebuild that yields the same bytes keeps the old
// documents (and their Last-Modified).
func (k *Keeper) buildGroup(next, old *snapshot) error {
	var src []byte
	for _, p := range slices.Sorted(maps.Keys(next.v3)) {
		if p != "api" && p != "apis" && len(next.v3[p].json) > 0 {
			src = next.v3[p].json
			break
		}
	}
	if src == nil {
		return fmt.Errorf("the upstream lists none of the group-versions the tier serves in /openapi/v3")
	}
	v2, v3, err := groupDocuments(k.opts.Group, k.opts.Version, next.v2.json, src)
	if err != nil {
		return err
	}
	next.groupPath = "apis/" + k.opts.Group + "/" + k.opts.Version
	if string(v2) != string(old.groupV2.json) {
		pb, err := handler.ToProtoBinary(v2)
		if err != nil {
			return fmt.Errorf("the group's v2 document: %w", err)
		}
		next.groupV2 = document{json: v2, proto: pb, etag: hashOf(v2), modified: k.now()}
	}
	if string(v3) != string(old.groupV3.json) {
		pb, err := handler3.ToV3ProtoBinary(v3)
		if err != nil {
			return fmt.Errorf("the group's v3 document: %w", err)
		}
		next.groupV3 = document{json: v3, proto: pb, etag: hashOf(v3), modified: k.now()}
	}
	next.groupV3Discovery, err = discoveryJSON(map[string]document{next.groupPath: next.groupV3})
	return err
}

// Package ingest starts what every role that holds objects runs per cached
// resource: the upstream ingester, its store and the watch hub fed from it.
// Standalone keeps every hash shard; a fleet's shard keeps a range of them.
package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/memrelease"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
	"github.com/cachetier/cachetier/cache-server/internal/upstreamhttp"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// Config says what to ingest.
type Config struct {
	Spec       v1alpha1.CacheProfileSpec
	HashShards int
	// HistoryWindow for stores and hubs.
	HistoryWindow time.Duration
	// Upstream is the apiserver the tier caches.
	Upstream *rest.Config
	// Owns restricts the stores to some keys (upstream.Options.Owns).
	Owns func(key string) bool
	// ContentHashes: stored objects carry their content hash
	// (upstream.Options.ContentHashes), for a shard's fronts.
	ContentHashes bool
	Metrics       *metrics.Metrics
	Log           logr.Logger
}

// Resource is one cached resource's pipeline.
type Resource struct {
	Entry    catalog.Entry
	Ingester *upstream.Ingester
	Hub      *watch.Hub
}

// Result is the running pipelines and what they learned about upstream.
type Result struct {
	Resources []Resource
	// Client talks to the apiserver (authentication, authorization).
	Client  kubernetes.Interface
	Version *version.Info
}

// Start resolves the profile's resources against the apiserver and starts
// one ingester per resource; they run until ctx ends.
func Start(ctx context.Context, cfg Config) (*Result, error) {
	upstreamCfg := upstreamhttp.Instrument(cfg.Upstream, cfg.Metrics.UpstreamResponses)
	upstreamCfg.Timeout = 0 // watches are long-lived; each request bounds itself
	kc, err := kubernetes.NewForConfig(upstreamCfg)
	if err != nil {
		return nil, err
	}
	ver, err := kc.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("reach the apiserver: %w", err)
	}
	entries, err := catalog.Resolve(ctx, upstreamCfg, cfg.Spec)
	if err != nil {
		return nil, err
	}
	httpClient, err := rest.HTTPClientFor(upstreamCfg)
	if err != nil {
		return nil, err
	}
	// One namespace watch per process, shared by every resource with a
	// namespaceSelector.
	var namespaces *upstream.NamespaceWatcher
	for _, e := range entries {
		if e.NamespaceSelector != nil && namespaces == nil {
			namespaces = upstream.NewNamespaceWatcher(kc)
			go namespaces.Run(ctx)
		}
	}
	released := memrelease.New(time.Second, cfg.Log, cfg.Metrics.MemoryReleased)
	res := &Result{Client: kc, Version: ver}
	for _, e := range entries {
		st, err := store.New(store.Options{Shards: cfg.HashShards, HistoryWindow: cfg.HistoryWindow, Indexes: e.FieldIndexes})
		if err != nil {
			return nil, err
		}
		hub := watch.New(watch.Options{
			Resource: e.Resource.String(), Store: st, FieldIndexes: e.FieldIndexes, Metrics: cfg.Metrics, Log: cfg.Log,
			HistoryWindow: cfg.HistoryWindow,
		})
		ing := upstream.New(upstream.Options{
			Resource: e.Resource, Host: upstreamCfg.Host, Client: httpClient, Store: st,
			Fields: fieldsFunc(e, cfg.Log), Metrics: cfg.Metrics, Log: cfg.Log,
			OnEvents: hub.Publish, OnRelist: hub.Relist, OnProgress: hub.Progress,
			OnInitialLoad: released.Loaded,
			Namespaces:    namespaceFilter(e, namespaces),
			Owns:          cfg.Owns,
			ContentHashes: cfg.ContentHashes,
		})
		cfg.Metrics.InitResource(e.Resource.String())
		go ing.Run(ctx)
		res.Resources = append(res.Resources, Resource{Entry: e, Ingester: ing, Hub: hub})
		cfg.Log.Info("caching resource", "resource", e.Resource.String(), "kind", e.Resource.Kind,
			"namespaced", e.Resource.Namespaced, "custom", e.Custom, "hashShards", cfg.HashShards)
	}
	go reportShardStats(ctx, res.Resources, cfg.Metrics)
	return res, nil
}

// namespaceFilter is the ingestion filter of an entry's namespaceSelector.
func namespaceFilter(e catalog.Entry, w *upstream.NamespaceWatcher) *upstream.NamespaceFilter {
	if e.NamespaceSelector == nil {
		return nil
	}
	return &upstream.NamespaceFilter{Selector: e.NamespaceSelector, Namespaces: w}
}

// fieldsFunc computes an object's field-selector values at ingestion. It
// is nil for resources whose only fields are metadata.name/namespace, so
// ingestion does not read more of those objects than their metadata.
func fieldsFunc(e catalog.Entry, log logr.Logger) upstream.FieldsFunc {
	if !e.Fields.NeedsObject() {
		return nil
	}
	return func(raw []byte) map[string]string {
		set, err := e.Fields.SetJSON(raw)
		if err != nil {
			// The object stays servable but only matches selectors on its
			// name and namespace; say so rather than drop it.
			log.Error(err, "cannot compute field-selector values", "resource", e.Resource.String())
			return nil
		}
		return set
	}
}

// reportShardStats publishes per-hash-shard object counts, bytes and RVs.
func reportShardStats(ctx context.Context, resources []Resource, m *metrics.Metrics) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		for _, r := range resources {
			label := r.Entry.Resource.String()
			for i, s := range r.Ingester.Store().Stats() {
				shard := fmt.Sprint(i)
				m.ShardObjects.WithLabelValues(label, shard).Set(float64(s.Objects))
				m.ShardBytes.WithLabelValues(label, shard).Set(float64(s.Bytes))
				m.ShardAppliedRV.WithLabelValues(label, shard).Set(float64(s.AppliedRV))
			}
			reportIndexStats(label, r.Ingester.Store(), m)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Package standalone runs the tier in one process: every hash shard of every
// cached resource plus the front, fed from one upstream stream per resource.
// It is the embedded default for a laptop, a small cluster, the tests and
// `make run`.
package standalone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/auth"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/memrelease"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// MinHistoryWindow is the apiserver's own watch-cache history: a shorter
// window would expire continue tokens and watch resumptions that the
// apiserver would still honour.
const MinHistoryWindow = 75 * time.Second

// Config is everything a standalone tier needs.
type Config struct {
	// ProfileName names the CacheProfile; it determines the aggregated API
	// group <name>.cache.cachetier.io.
	ProfileName string
	Spec        v1alpha1.CacheProfileSpec
	// Upstream is the apiserver the tier caches.
	Upstream *rest.Config
	// Listener serves HTTPS; Certificate is its serving certificate.
	Listener    net.Listener
	Certificate tls.Certificate
	Log         logr.Logger
	// Registry receives the tier's metrics (a new one when nil).
	Registry *prometheus.Registry
	// Profiling serves net/http/pprof under /debug/pprof/. It sits behind
	// the same authentication and authorization as everything else (a
	// non-resource URL: kube-apiserver's own rule for its profiles).
	Profiling bool
	// ProtobufCacheBytes bounds the protobuf encodings kept for protobuf
	// clients (0: encoding.DefaultCacheBytes).
	ProtobufCacheBytes int64
}

// LoadProfile reads a CacheProfile manifest and applies the defaults the
// CRD schema would apply at admission.
func LoadProfile(path string) (*v1alpha1.CacheProfile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var p v1alpha1.CacheProfile
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	if p.Name == "" {
		return nil, fmt.Errorf("profile %s: metadata.name is required", path)
	}
	return &p, nil
}

// Settings are the effective tier settings of a spec, defaults applied.
type Settings struct {
	HashShards       int
	FreshnessTimeout time.Duration
	HistoryWindow    time.Duration
}

// EffectiveSettings applies defaults and checks bounds.
func EffectiveSettings(spec v1alpha1.CacheProfileSpec) (Settings, error) {
	s := Settings{HashShards: int(spec.HashShards), FreshnessTimeout: 3 * time.Second, HistoryWindow: 150 * time.Second}
	if s.HashShards == 0 {
		s.HashShards = v1alpha1.DefaultHashShards
	}
	if spec.FreshnessTimeout != nil {
		s.FreshnessTimeout = spec.FreshnessTimeout.Duration
	}
	if spec.HistoryWindow != nil {
		s.HistoryWindow = spec.HistoryWindow.Duration
	}
	switch {
	case s.HashShards < 1:
		return s, fmt.Errorf("hashShards must be at least 1, got %d", s.HashShards)
	case s.FreshnessTimeout <= 0:
		return s, fmt.Errorf("freshnessTimeout must be positive, got %s", s.FreshnessTimeout)
	case s.HistoryWindow < MinHistoryWindow:
		return s, fmt.Errorf("historyWindow must be at least %s (the apiserver's), got %s", MinHistoryWindow, s.HistoryWindow)
	}
	return s, nil
}

// PathPrefix is the aggregated API path of a profile.
func PathPrefix(profile string) string {
	return "/apis/" + profile + ".cache.cachetier.io/v1alpha1"
}

// Run starts ingestion and serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	settings, err := EffectiveSettings(cfg.Spec)
	if err != nil {
		return err
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := metrics.New(reg)
	upstreamCfg := rest.CopyConfig(cfg.Upstream)
	upstreamCfg.Timeout = 0 // watches are long-lived; each request bounds itself
	kc, err := kubernetes.NewForConfig(upstreamCfg)
	if err != nil {
		return err
	}
	ver, err := kc.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("reach the apiserver: %w", err)
	}
	entries, err := catalog.Resolve(ctx, upstreamCfg, cfg.Spec)
	if err != nil {
		return err
	}
	httpClient, err := rest.HTTPClientFor(upstreamCfg)
	if err != nil {
		return err
	}
	host := upstreamCfg.Host
	// One namespace watch per tier, shared by every resource with a
	// namespaceSelector.
	var namespaces *upstream.NamespaceWatcher
	for _, e := range entries {
		if e.NamespaceSelector != nil && namespaces == nil {
			namespaces = upstream.NewNamespaceWatcher(kc)
			go namespaces.Run(ctx)
		}
	}
	released := memrelease.New(time.Second, cfg.Log, m.MemoryReleased)
	var resources []front.Resource
	for _, e := range entries {
		st, err := store.New(store.Options{Shards: settings.HashShards, HistoryWindow: settings.HistoryWindow})
		if err != nil {
			return err
		}
		fieldsOf := fieldsFunc(e, cfg.Log)
		hub := watch.New(watch.Options{
			Resource: e.Resource.String(), Store: st, Metrics: m, Log: cfg.Log,
			HistoryWindow: settings.HistoryWindow,
		})
		ing := upstream.New(upstream.Options{
			Resource: e.Resource, Host: host, Client: httpClient, Store: st,
			Fields: fieldsOf, Metrics: m, Log: cfg.Log,
			OnEvents: hub.Publish, OnRelist: hub.Relist, OnProgress: hub.Progress,
			OnInitialLoad: released.Loaded,
			Namespaces:    namespaceFilter(e, namespaces),
		})
		go ing.Run(ctx)
		resources = append(resources, front.Resource{Entry: e, Ingester: ing, Hub: hub})
		cfg.Log.Info("caching resource", "resource", e.Resource.String(), "kind", e.Resource.Kind,
			"namespaced", e.Resource.Namespaced, "custom", e.Custom, "hashShards", settings.HashShards)
	}
	go reportShardStats(ctx, resources, m)

	prefix := PathPrefix(cfg.ProfileName)
	api := front.New(front.Options{
		Resources: resources, FreshnessTimeout: settings.FreshnessTimeout, PathPrefix: prefix,
		Version: ver, Metrics: m, Log: cfg.Log, ProtobufCacheBytes: cfg.ProtobufCacheBytes,
	})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", api)
	if cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	handler, clientAuth, err := auth.Wrap(ctx, auth.Options{
		Client: kc, PathPrefix: prefix, AlwaysAllowPaths: []string{"/healthz", "/livez", "/readyz"},
		ConnCacheResults: m.AuthnConnCache,
	}, mux)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cfg.Certificate}, ClientAuth: clientAuth, MinVersion: tls.VersionTLS12},
		// Per-connection authentication cache (auth.Wrap's authenticator).
		ConnContext: auth.ConnContext,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(cfg.Listener, "", "") }()
	cfg.Log.Info("serving", "address", cfg.Listener.Addr().String(), "pathPrefix", prefix, "resources", len(resources))
	select {
	case <-ctx.Done():
		// End watch streams first: Shutdown waits for active requests and
		// never interrupts a watch on its own.
		for _, r := range resources {
			r.Hub.Close()
		}
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
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
// ingestion does not decode every object fully just to read those.
func fieldsFunc(e catalog.Entry, log logr.Logger) upstream.FieldsFunc {
	if !e.Fields.NeedsObject() {
		return nil
	}
	return func(obj map[string]any) map[string]string {
		set, err := e.Fields.Set(obj)
		if err != nil {
			// The object stays servable but only matches selectors on its
			// name and namespace; say so rather than drop it.
			log.Error(err, "cannot compute field-selector values", "resource", e.Resource.String())
			return nil
		}
		return set
	}
}

// reportShardStats publishes per-shard object counts, bytes and RVs.
func reportShardStats(ctx context.Context, resources []front.Resource, m *metrics.Metrics) {
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
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

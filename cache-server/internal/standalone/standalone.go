// Package standalone runs the tier in one process: every hash shard of every
// cached resource plus the front, fed from one upstream stream per resource.
// It is the embedded default for a laptop, a small cluster, the tests and
// `make run`.
package standalone

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/apf"
	"github.com/cachetier/cachetier/cache-server/internal/auth"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/deadline"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/ingest"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/openapi"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
	"github.com/cachetier/cachetier/cache-server/internal/serving"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
	"github.com/cachetier/cachetier/cache-server/internal/upstreamhttp"
	"github.com/cachetier/cachetier/internal/aggpath"
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
	// GetCertificate, when set, replaces Certificate (serving.Config).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	Log            logr.Logger
	// Registry receives the tier's metrics (a new one when nil).
	Registry *prometheus.Registry
	// Profiling serves net/http/pprof under /debug/pprof/. It sits behind
	// the same authentication and authorization as everything else (a
	// non-resource URL: kube-apiserver's own rule for its profiles).
	Profiling bool
	// ProtobufCacheBytes bounds the protobuf encodings kept for protobuf
	// clients (0: encoding.DefaultCacheBytes).
	ProtobufCacheBytes int64
	// ListGzipCacheBytes bounds the compressed LIST chunks kept for later
	// LISTs (front.Options.ListGzipCacheBytes).
	ListGzipCacheBytes int64
	// DisablePriorityAndFairness serves without priority and fairness
	// (--enable-priority-and-fairness=false: measurements without it).
	DisablePriorityAndFairness bool
	// BulkRequestNice is the nice value of the threads that run large
	// LISTs' and watch-lists' work (package bulkthread); 0: the process's
	// own.
	BulkRequestNice int
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

// StartOpenAPI starts keeping the OpenAPI documents of the group-versions
// of resources (package openapi) fresh until ctx ends; shared by the
// standalone tier and a fleet's fronts.
func StartOpenAPI(ctx context.Context, profile string, upstream *rest.Config, resources []front.Resource, m *metrics.Metrics, log logr.Logger) (*openapi.Keeper, error) {
	var gvs []schema.GroupVersion
	for _, r := range resources {
		gvs = append(gvs, r.Entry.Resource.GVR.GroupVersion())
	}
	k, err := openapi.New(openapi.Options{
		Upstream: upstreamhttp.Instrument(upstream, m.UpstreamResponses), Served: gvs,
		Group: aggpath.For(profile).Group, Version: v1alpha1.AggregatedAPIVersion,
		Refreshes: m.OpenAPIRefreshes, LastSuccess: m.OpenAPILastSuccess, Log: log.WithName("openapi"),
	})
	if err != nil {
		return nil, err
	}
	go k.Run(ctx)
	return k, nil
}

// Run starts ingestion and serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	settings, err := EffectiveSettings(cfg.Spec)
	if err != nil {
		return err
	}
	reg := serving.Registry(cfg.Registry)
	m := metrics.New(reg)
	ingested, err := ingest.Start(ctx, ingest.Config{
		Spec: cfg.Spec, HashShards: settings.HashShards, HistoryWindow: settings.HistoryWindow,
		Upstream: cfg.Upstream, Metrics: m, Log: cfg.Log,
	})
	if err != nil {
		return err
	}
	crds, err := apiextensionsclient.NewForConfig(upstreamhttp.Instrument(cfg.Upstream, m.UpstreamResponses))
	if err != nil {
		return err
	}
	entries := make([]catalog.Entry, len(ingested.Resources))
	for i, r := range ingested.Resources {
		entries[i] = r.Entry
	}
	printers := tables.ForEntries(ctx, crds, entries, cfg.Log)
	var resources []front.Resource
	for i, r := range ingested.Resources {
		resources = append(resources, front.Resource{Entry: r.Entry, Source: front.LocalSource{Ingester: r.Ingester}, Hub: r.Hub, Printer: printers[i]})
	}
	authClient, err := auth.ClientFor(upstreamhttp.Instrument(cfg.Upstream, m.UpstreamResponses))
	if err != nil {
		return err
	}

	paths := aggpath.For(cfg.ProfileName)
	docs, err := StartOpenAPI(ctx, cfg.ProfileName, cfg.Upstream, resources, m, cfg.Log)
	if err != nil {
		return err
	}
	api := front.New(front.Options{
		Resources: resources, FreshnessTimeout: settings.FreshnessTimeout, Paths: paths,
		Version: ingested.Version, Metrics: m, Log: cfg.Log, ProtobufCacheBytes: cfg.ProtobufCacheBytes, ListGzipCacheBytes: cfg.ListGzipCacheBytes, OpenAPI: docs,
	})
	var fairness func(http.Handler) http.Handler
	if !cfg.DisablePriorityAndFairness {
		learner := seatcpu.New(m.SeatCPU, cfg.Log.WithName("seatcpu"))
		go learner.Run(ctx)
		fairness = apf.Run(ctx, authClient, cfg.Spec.ServerConcurrencyLimit, api, learner, m.APFConfigSynced.WithLabelValues(), m.APFLingering, cfg.BulkRequestNice, cfg.Log).Filter
	}
	return serving.Run(ctx, serving.Config{
		Listener: cfg.Listener, Certificate: cfg.Certificate, GetCertificate: cfg.GetCertificate, Client: authClient, Paths: paths,
		API: api, Registry: reg, Metrics: m, Profiling: cfg.Profiling, Log: cfg.Log,
		PriorityAndFairness: fairness, Gatherer: apf.Gatherer(), RequestTimeout: deadline.RequestTimeout,
		BeforeShutdown: func() {
			for _, r := range resources {
				r.Hub.Close()
			}
		},
	})
}

// Package frontrole runs a fleet front: the aggregated API (package front)
// over the fleet's shards (package fleet), behind delegated authentication
// and authorization. It holds no objects: LISTs and GETs are read from the
// shards at one RV and merged by key; watches are served from a hub fed by
// the shards' change streams merged in RV order.
package frontrole

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/apf"
	"github.com/cachetier/cachetier/cache-server/internal/auth"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/deadline"
	"github.com/cachetier/cachetier/cache-server/internal/fleet"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
	"github.com/cachetier/cachetier/cache-server/internal/serving"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
	"github.com/cachetier/cachetier/cache-server/internal/upstreamhttp"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// Config is one front.
type Config struct {
	ProfileName string
	Spec        v1alpha1.CacheProfileSpec
	Topology    *topology.Topology
	// Upstream is the apiserver (discovery, version, authentication and
	// authorization of clients).
	Upstream *rest.Config
	// ShardClient reaches the shards: TLS trusting their CA and the
	// front's credentials (the shards authorize the front like any
	// caller).
	ShardClient *http.Client
	Listener    net.Listener
	Certificate tls.Certificate
	// GetCertificate, when set, replaces Certificate (serving.Config).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ProbeListener, when set, serves /metrics, /readyz, /livez over HTTP.
	ProbeListener      net.Listener
	Registry           *prometheus.Registry
	Profiling          bool
	ProtobufCacheBytes int64
	// ListGzipCacheBytes bounds the compressed chunks kept for later
	// LISTs and watch-lists (front.Options.ListGzipCacheBytes).
	ListGzipCacheBytes int64
	// GoawayChance spreads the aggregator's connection over the fronts
	// (serving.Config.GoawayChance).
	GoawayChance float64
	Log          logr.Logger
	// DisablePriorityAndFairness serves without priority and fairness
	// (--enable-priority-and-fairness=false: measurements without it).
	DisablePriorityAndFairness bool
	// BulkRequestNice is the nice value of the threads that run large
	// LISTs' and watch-lists' work (package bulkthread); 0: the process's
	// own.
	BulkRequestNice int
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	settings, err := standalone.EffectiveSettings(cfg.Spec)
	if err != nil {
		return err
	}
	if err := cfg.Topology.Validate(); err != nil {
		return err
	}
	if int(cfg.Topology.HashShards) != settings.HashShards {
		return fmt.Errorf("the topology has %d hash shards, the profile %d", cfg.Topology.HashShards, settings.HashShards)
	}
	reg := serving.Registry(cfg.Registry)
	m := metrics.New(reg)
	upstreamCfg := upstreamhttp.Instrument(cfg.Upstream, m.UpstreamResponses)
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
	authClient, err := auth.ClientFor(upstreamCfg)
	if err != nil {
		return err
	}
	client := fleet.NewClient(cfg.ShardClient, cfg.Topology, m)
	crds, err := apiextensionsclient.NewForConfig(upstreamCfg)
	if err != nil {
		return err
	}
	printers := tables.ForEntries(ctx, crds, entries, cfg.Log)
	var resources []front.Resource
	var sources []*fleet.Source
	for i, e := range entries {
		src := fleet.NewSource(fleet.Options{Entry: e, Client: client, HistoryWindow: settings.HistoryWindow, FreshnessTimeout: settings.FreshnessTimeout, Metrics: m, Log: cfg.Log})
		go src.Run(ctx)
		sources = append(sources, src)
		resources = append(resources, front.Resource{Entry: e, Source: src, Hub: src.Hub(), Printer: printers[i]})
	}
	cfg.Log.Info("front", "shards", len(cfg.Topology.Shards), "hashShards", settings.HashShards, "resources", len(resources))
	paths := aggpath.For(cfg.ProfileName)
	docs, err := standalone.StartOpenAPI(ctx, cfg.ProfileName, cfg.Upstream, resources, m, cfg.Log)
	if err != nil {
		return err
	}
	api := front.New(front.Options{
		Resources: resources, FreshnessTimeout: settings.FreshnessTimeout, Paths: paths,
		Version: ver, Metrics: m, Log: cfg.Log, ProtobufCacheBytes: cfg.ProtobufCacheBytes, ListGzipCacheBytes: cfg.ListGzipCacheBytes,
		OpenAPI: docs,
	})
	if cfg.ProbeListener != nil {
		defer serving.StartProbes(ctx, cfg.ProbeListener, serving.Gatherer(reg, apf.Gatherer()), func() error {
			for i, s := range sources {
				select {
				case <-s.Synced():
				default:
					return fmt.Errorf("the fleet's streams for %s have not started yet", entries[i].Resource.String())
				}
			}
			return docs.Ready()
		})()
	}
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
		GoawayChance: cfg.GoawayChance,
		BeforeShutdown: func() {
			for _, s := range sources {
				s.Hub().Close()
			}
		},
	})
}

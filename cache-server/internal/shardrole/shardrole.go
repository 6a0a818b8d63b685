// Package shardrole runs a fleet shard: it ingests every cached resource
// from the apiserver, keeps the objects of its range of hash shards (every
// upstream RV still counts as progress), and serves them to the fleet's
// fronts (package shardserver) behind delegated authentication and
// authorization.
package shardrole

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/ingest"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
	"github.com/cachetier/cachetier/cache-server/internal/serving"
	"github.com/cachetier/cachetier/cache-server/internal/shardserver"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
)

// Config is one shard.
type Config struct {
	Name string
	Spec v1alpha1.CacheProfileSpec
	// First and Last are the hash shards it keeps (inclusive).
	First, Last int
	Upstream    *rest.Config
	Listener    net.Listener
	Certificate tls.Certificate
	// GetCertificate, when set, replaces Certificate (serving.Config).
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ProbeListener, when set, serves /metrics, /readyz, /livez over HTTP.
	ProbeListener net.Listener
	Registry      *prometheus.Registry
	Profiling     bool
	Log           logr.Logger
}

// Run ingests and serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	settings, err := standalone.EffectiveSettings(cfg.Spec)
	if err != nil {
		return err
	}
	if cfg.First < 0 || cfg.Last >= settings.HashShards || cfg.First > cfg.Last {
		return fmt.Errorf("hash shards %d-%d are outside the profile's 0-%d", cfg.First, cfg.Last, settings.HashShards-1)
	}
	reg := serving.Registry(cfg.Registry)
	m := metrics.New(reg)
	total := settings.HashShards
	ingested, err := ingest.Start(ctx, ingest.Config{
		Spec: cfg.Spec, HashShards: total, HistoryWindow: settings.HistoryWindow,
		Upstream: cfg.Upstream, Metrics: m, Log: cfg.Log,
		Owns: func(key string) bool {
			h := keyhash.Shard(key, total)
			return h >= cfg.First && h <= cfg.Last
		},
		// Sent with every list item to the fronts (shardwire.ParamContentHash).
		ContentHashes: true,
	})
	if err != nil {
		return err
	}
	cfg.Log.Info("shard", "name", cfg.Name, "hashShards", fmt.Sprintf("%d-%d of %d", cfg.First, cfg.Last, total))
	ready := func() error {
		for _, r := range ingested.Resources {
			select {
			case <-r.Ingester.Synced():
			default:
				return fmt.Errorf("cache for %s is not synced yet", r.Entry.Resource.String())
			}
		}
		return nil
	}
	if cfg.ProbeListener != nil {
		defer serving.StartProbes(ctx, cfg.ProbeListener, reg, ready)()
	}
	learner := seatcpu.New(m.SeatCPU, cfg.Log.WithName("seatcpu"))
	go learner.Run(ctx)
	// A shard has no admission of its own: every front's bulk LIST fans
	// out to it, so it lowers only while a Go P stays free for its short
	// reads (bulkthread.Slots).
	bulk := bulkthread.NewSlots(bulkthread.SlotsBesideOneP())
	return serving.Run(ctx, serving.Config{
		Listener: cfg.Listener, Certificate: cfg.Certificate, GetCertificate: cfg.GetCertificate, Client: ingested.Client,
		API: shardserver.New(ingested.Resources, shardwire.HashRange{First: cfg.First, Last: cfg.Last, Total: total}, learner, bulk, m, cfg.Log), Registry: reg, Metrics: m,
		Profiling: cfg.Profiling, Log: cfg.Log,
		BeforeShutdown: func() {
			for _, r := range ingested.Resources {
				r.Hub.Close()
			}
		},
	})
}

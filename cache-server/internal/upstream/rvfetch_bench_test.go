package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/hack/controlplane"
)

// BenchmarkCurrentRVRealAPIServer is what a consistent read pays for its RV
// fetch against a real kube-apiserver (bin/k8s, started here; skipped when
// the binaries are missing): one watch-list round trip that returns only the
// initial-events-end bookmark, over the same HTTP/2 client the tier uses.
// Calls are sequential, so nothing is coalesced: this is the latency one
// isolated LIST adds, and the tier's share of its CPU (the apiserver's is
// not in the tier's process).
func BenchmarkCurrentRVRealAPIServer(b *testing.B) {
	if _, err := controlplane.FindBinDir(); err != nil {
		b.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceClusterIPRange: "127.83.0.0/24"})
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Stop()
	cfg, err := cp.RESTConfig()
	if err != nil {
		b.Fatal(err)
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	st, _ := store.New(store.Options{Shards: 1})
	in := New(Options{
		Resource: Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
		Host:     cfg.Host, Client: client, Store: st, Metrics: metrics.New(prometheus.NewRegistry()), Log: logr.Discard(),
	})
	if _, err := in.CurrentRV(ctx); err != nil { // connection set-up
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := in.CurrentRV(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

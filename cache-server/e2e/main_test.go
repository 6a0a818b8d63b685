// Package e2e compares the tier's LIST and GET answers (standalone and a
// fleet of shards behind a front) with the
// real kube-apiserver's on the same data (hack/sampledata).
package e2e

import (
	"context"
	"os"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
	"github.com/cachetier/cachetier/hack/sampledata"
)

// testEnv is the tier under test (see forEachTier) and the apiserver it is
// compared with; every test reads the same data.
var testEnv *env

// tiers are the two shapes of the tier: standalone (every hash shard in
// one process) and a fleet (two shard servers and a front merging them).
var tiers []*env

// fleetLongWatch is TestFleetWatchesOutliveRequestTimeout's run, started
// with the fleet so that it overlaps the other tests.
var fleetLongWatch *longWatch

type env struct {
	name             string
	admin, tierAdmin *rest.Config
	// metric reads one series of the tier's /metrics (tiertest.Env.Metric;
	// standalone only: a fleet's front serves them on another port).
	metric func(series string) (string, error)
}

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		Spec: profile(), ServiceClusterIPRange: "127.77.0.0/24",
		Seed: func(ctx context.Context, admin *rest.Config) error {
			if err := sampledata.Seed(ctx, admin, sampledata.Default()); err != nil {
				return err
			}
			return seedIndexData(ctx, admin)
		},
		FleetShards: 2,
	}, func(e *tiertest.Env) {
		tiers = []*env{
			{name: "standalone", admin: e.Admin, tierAdmin: e.TierAdmin, metric: e.Metric},
			{name: "fleet", admin: e.Admin, tierAdmin: e.FleetAdmin},
		}
		fleetLongWatch = startLongWatch(e)
	}))
}

// forEachTier runs test once against each tier shape (the package's tests
// do not run in parallel, so testEnv can point at the current one).
func forEachTier(t *testing.T, test func(*testing.T)) {
	for _, e := range tiers {
		testEnv = e
		t.Run(e.name, test)
	}
}

// profile caches every resource the tests read.
func profile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
			{Version: "v1", Resource: "secrets"},
			// spec.nodeName is indexed by default (the apiserver's own
			// index); status.phase only by the profile.
			{Version: "v1", Resource: "pods", FieldIndexes: []string{"status.phase"}},
			{Version: "v1", Resource: "namespaces"},
			{Version: "v1", Resource: "events"},
			{Group: "example.cachetier.io", Version: "v1", Resource: "widgets", FieldIndexes: []string{"spec.color"}},
		},
	}
}

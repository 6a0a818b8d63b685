// Package e2e compares the standalone tier's LIST and GET answers with the
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

// testEnv is shared by the package's tests: every test reads the same data.
var testEnv *env

type env struct {
	admin, tierAdmin *rest.Config
}

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		Spec: profile(), ServiceClusterIPRange: "127.77.0.0/24",
		Seed: func(ctx context.Context, admin *rest.Config) error {
			return sampledata.Seed(ctx, admin, sampledata.Default())
		},
	}, func(e *tiertest.Env) { testEnv = &env{admin: e.Admin, tierAdmin: e.TierAdmin} }))
}

// profile caches every resource the tests read.
func profile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
			{Version: "v1", Resource: "secrets"},
			{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}},
			{Version: "v1", Resource: "namespaces"},
			{Version: "v1", Resource: "events"},
			{Group: "example.cachetier.io", Version: "v1", Resource: "widgets"},
		},
	}
}

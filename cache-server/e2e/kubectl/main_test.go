// Package kubectl drives real clients through the tier: the kubectl built
// with the control plane against the tier directly and through the real
// aggregation layer (a `cache-server standalone` process registered by an
// APIService), every command compared with the same command against the
// apiserver; and read-your-writes through consistent reads.
package kubectl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
	"github.com/cachetier/cachetier/hack/sampledata"
	"github.com/cachetier/cachetier/hack/tierproc"
)

// aggProfile is the profile of the tier process behind the aggregator.
const aggProfile = "agg"

var (
	env *tiertest.Env
	// agg is the tier process registered with the aggregator; aggKubeconfig
	// is the admin kubeconfig whose server URL ends in its prefix.
	agg           *tierproc.Tier
	aggKubeconfig string
	// fleet is a fleet of `cache-server shard` processes and a `cache-server
	// front` registered with the aggregator; fleetKubeconfig its admin
	// kubeconfig.
	fleet           *tierproc.Fleet
	fleetKubeconfig string
)

// fleetProfile is the profile of the fleet behind the aggregator.
const fleetProfile = "fleet"

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	binDir, err := os.MkdirTemp("", "cachetier-kubectl-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	binary := filepath.Join(binDir, "cache-server")
	built := make(chan error, 1)
	go func() { built <- tierproc.Build(ctx, binary) }()

	env, err = tiertest.Start(ctx, tiertest.Options{
		Spec: profile(), ServiceClusterIPRange: "127.79.0.0/24",
		// Short, so that TestWatchOutlivesRequestTimeout shows in about a
		// minute what the default (60 s) would take minutes to; no other
		// request here comes near it.
		ExtraAPIServerFlags: []string{"--request-timeout=" + requestTimeout.String()},
		Seed: func(ctx context.Context, admin *rest.Config) error {
			return sampledata.Seed(ctx, admin, sampledata.Default())
		},
	})
	if err != nil {
		<-built
		fmt.Fprintln(os.Stderr, "kubectl e2e setup:", err)
		return 1
	}
	defer env.Stop()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup:", err)
		return 1
	}
	if openAPIBefore, err = readClusterOpenAPI(ctx, env.Admin, env.CP.AdminKubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup: the cluster's OpenAPI:", err)
		return 1
	}
	start := time.Now()
	agg, err = tierproc.Start(ctx, env.CP, tierproc.Options{Binary: binary, Profile: aggProfile, Spec: profile()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup: aggregated tier:", err)
		return 1
	}
	aggKubeconfig = filepath.Join(env.CP.Dir, "kubeconfig-admin-aggregated")
	if err := agg.AggregatedKubeconfig(env.CP.AdminKubeconfig, aggKubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kubectl e2e: tier process registered at %s in %s\n", agg.AggregatedURL, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	fleet, err = tierproc.StartFleet(ctx, env.CP, tierproc.FleetOptions{
		Options: tierproc.Options{Binary: binary, Profile: fleetProfile, Spec: profile(), ServiceIPIndex: 51},
		Shards:  2,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup: fleet:", err)
		return 1
	}
	fleetKubeconfig = filepath.Join(env.CP.Dir, "kubeconfig-admin-fleet")
	if err := fleet.AggregatedKubeconfig(env.CP.AdminKubeconfig, fleetKubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl e2e setup:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kubectl e2e: fleet (2 shard processes, 1 front) registered at %s in %s\n", fleet.AggregatedURL, time.Since(start).Round(time.Millisecond))
	return m.Run()
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
			// kubectl describe namespace lists both; a tier without them
			// answers 404 and describe leaves their sections out
			// (docs/differences.md).
			{Version: "v1", Resource: "resourcequotas"},
			{Version: "v1", Resource: "limitranges"},
			{Group: "example.cachetier.io", Version: "v1", Resource: "widgets"},
			{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"},
		},
	}
}

// kubectlResult is one kubectl run.
type kubectlResult struct {
	stdout, stderr string
	err            error
}

func (r kubectlResult) String() string {
	return fmt.Sprintf("err=%v\nstdout:\n%s\nstderr:\n%s", r.err, clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 3000 {
		return s[:3000] + "…"
	}
	return s
}

// kubectl runs the control plane's kubectl with kubeconfig. It never uses
// the discovery cache of the user's home directory.
func kubectl(t *testing.T, kubeconfig string, args ...string) kubectlResult {
	t.Helper()
	return kubectlEnv(t, nil, kubeconfig, args...)
}

// kubectlEnv is kubectl with extra environment variables (NAME=value).
func kubectlEnv(t *testing.T, environ []string, kubeconfig string, args ...string) kubectlResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cacheDir := t.TempDir()
	cmd := exec.CommandContext(ctx, env.CP.Kubectl(), append([]string{"--kubeconfig=" + kubeconfig, "--cache-dir=" + cacheDir}, args...)...)
	if environ != nil {
		cmd.Env = append(os.Environ(), environ...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return kubectlResult{stdout: stdout.String(), stderr: stderr.String(), err: err}
}

func mustKubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	r := kubectl(t, kubeconfig, args...)
	if r.err != nil {
		t.Fatalf("kubectl %s (%s): %s", strings.Join(args, " "), kubeconfig, r)
	}
	return r.stdout
}

// noErr ends the test on a setup error.
func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

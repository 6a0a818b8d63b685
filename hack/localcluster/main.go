// Command localcluster is `make run`: by default it starts a real etcd and
// kube-apiserver on loopback (see hack/controlplane), seeds sample data
// (hack/sampledata), starts the cache tier as a real `cache-server
// standalone` process registered with the aggregation layer by an
// APIService (see hack/tierproc), prints how to reach both, and tears
// everything down on Ctrl-C. With -node (`make run CLUSTER=node NODES=n`)
// it installs cachetier as users do, on a real cluster of n nodes
// (node.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/imagebuild"
	"github.com/cachetier/cachetier/hack/sampledata"
	"github.com/cachetier/cachetier/hack/tierproc"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	port := flag.Int("port", 6443, "apiserver secure port on 127.0.0.1 (0 picks a free one; 6443 falls back to a free port when taken)")
	dir := flag.String("dir", "", "working directory (default: a temporary directory, removed on exit)")
	cacheServer := flag.String("cache-server", "", "cache-server binary (default: cache-server next to this binary, else built with go build into the working directory)")
	profileName := flag.String("profile", "demo", "CacheProfile name: the tier is read through /apis/<profile>.cache.cachetier.io/v1alpha1/watch (internal/aggpath)")
	noTier := flag.Bool("no-tier", false, "start the control plane only (no sample data, no tier)")
	verbosity := flag.Int("v", 0, "cache-server log verbosity")
	fleetShards := flag.Int("fleet", 0, "run the tier as a fleet: this many `cache-server shard` processes and a `cache-server front` (0: one `cache-server standalone`)")
	node := flag.Bool("node", false, "install cachetier as users do on a real cluster of -nodes nodes (kubelet, containerd, kube-proxy, CoreDNS; needs root): the operator from the image with kustomize, the sample profile and sample data (images from $"+imagebuild.EnvImages+", else built)")
	nodes := flag.Int("nodes", 1, "with -node: how many nodes (1 to 16)")
	flag.Parse()

	if *port == 6443 && !portFree(*port) {
		*port = 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *node {
		return runNode(ctx, runDir(os.TempDir()), *nodes)
	}

	cp, err := controlplane.Start(ctx, controlplane.Options{
		Dir:                   *dir,
		SecurePort:            *port,
		ServiceClusterIPRange: controlplane.DefaultServiceClusterIPRange,
		Log:                   os.Stdout,
	})
	if err != nil {
		return err
	}
	// cp.Stop stops the tier process first, then the apiserver and etcd.
	defer func() {
		fmt.Println("stopping the tier and the control plane")
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop:", err)
		}
	}()

	outDir := runDir(cp.Dir)
	kubeconfig := filepath.Join(outDir, "kubeconfig")
	if err := copyFile(cp.AdminKubeconfig, kubeconfig); err != nil {
		return err
	}
	kubectl := cp.Kubectl()
	if *noTier {
		fmt.Printf(`
cachetier local control plane is up (no tier: -no-tier).
  apiserver:   %s (service range %s)
  kubeconfig:  %s
  logs:        %s/*.log

Try:
  %s --kubeconfig %s get ns

Press Ctrl-C to stop; everything is torn down.
`, cp.URL, cp.ServiceClusterIPRange, kubeconfig, cp.Dir, kubectl, kubeconfig)
		<-ctx.Done()
		return nil
	}

	admin, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	admin.QPS, admin.Burst = 1000, 2000
	start := time.Now()
	if err := sampledata.Seed(ctx, admin, sampledata.Default()); err != nil {
		return fmt.Errorf("seed sample data: %w", err)
	}
	fmt.Printf("seeded sample data in %s\n", time.Since(start).Round(time.Millisecond))

	binary := *cacheServer
	if binary == "" {
		if self, err := os.Executable(); err == nil {
			if cand := filepath.Join(filepath.Dir(self), "cache-server"); isFile(cand) {
				binary = cand
			}
		}
	}
	if binary == "" {
		binary = filepath.Join(cp.Dir, "cache-server")
		fmt.Println("building cache-server")
		if err := tierproc.Build(ctx, binary); err != nil {
			return err
		}
	}
	start = time.Now()
	tierOpts := tierproc.Options{Binary: binary, Profile: *profileName, Spec: sampleProfile(), Verbosity: *verbosity}
	var tier *tierproc.Tier
	if *fleetShards > 0 {
		fleet, err := tierproc.StartFleet(ctx, cp, tierproc.FleetOptions{Options: tierOpts, Shards: *fleetShards})
		if err != nil {
			return fmt.Errorf("start the fleet: %w", err)
		}
		tier = fleet.Tier
		fmt.Printf("fleet: %d shard processes (metrics %s), front metrics and probes at %s\n", *fleetShards, strings.Join(fleet.ShardMetricsURLs, " "), fleet.FrontMetricsURL)
	} else if tier, err = tierproc.Start(ctx, cp, tierOpts); err != nil {
		return fmt.Errorf("start the tier: %w", err)
	}
	fmt.Printf("tier %s serving at %s, registered as APIService v1alpha1.%s (%s)\n", binary, tier.DirectURL, tier.Paths.Group, time.Since(start).Round(time.Millisecond))

	tierKubeconfig := filepath.Join(outDir, "kubeconfig-tier")
	if err := tier.AggregatedKubeconfig(cp.AdminKubeconfig, tierKubeconfig); err != nil {
		return err
	}
	directKubeconfig := filepath.Join(outDir, "kubeconfig-tier-direct")
	if err := tier.DirectKubeconfig(cp.AdminKubeconfig, directKubeconfig); err != nil {
		return err
	}
	profileCopy := filepath.Join(outDir, "profile.yaml")
	_ = copyFile(tier.ProfileFile, profileCopy)

	k := func(cfg string) string { return kubectl + " --kubeconfig " + cfg }
	fmt.Printf(`
cachetier is up: a local control plane with sample data, and the cache tier in front of it.
  apiserver:         %[1]s (service range %[2]s)
  tier (aggregated): %[3]s
  tier (direct):     %[4]s (ClusterIP of Service %[5]s)
  profile:           %[6]s
  logs:              %[7]s/*.log (tier: %[8]s)

Kubeconfigs (admin):
  apiserver:                  %[9]s
  tier via the aggregator:    %[10]s   (server URL ends in %[11]s)
  tier directly (metrics):    %[12]s

Try (the same commands work with the apiserver kubeconfig, for comparison):
  %[13]s get pods -A
  %[13]s get configmaps -A -l app=a,tier=x
  %[13]s get pods -A --field-selector spec.nodeName=node-1
  %[13]s get secrets -A --field-selector type=example.com/custom
  %[13]s get wg -A --field-selector spec.color=red
  %[13]s get configmaps -A --chunk-size=50 -v=6 2>&1 >/dev/null | grep -c '"Response".*limit=50'   # pages
  %[13]s get configmap cm-007 -n ns-2 -o yaml
  %[13]s get --raw /api/v1/namespaces/ns-1/pods | head -c 300; echo
  %[13]s create configmap x -n ns-0      # refused: the tier is read-only
  %[14]s get --raw /metrics | grep cachetier_freshness_wait_seconds_count
  %[15]s get apiservice v1alpha1.%[16]s

Press Ctrl-C to stop; the tier and the control plane are torn down.
`, cp.URL, cp.ServiceClusterIPRange, tier.AggregatedURL, tier.DirectURL, tier.ServerName, profileCopy, cp.Dir, tier.Log,
		kubeconfig, tierKubeconfig, tier.Paths.Prefix, directKubeconfig,
		k(tierKubeconfig), k(directKubeconfig), k(kubeconfig), tier.Paths.Group)

	select {
	case <-ctx.Done():
	case <-tier.Exited:
		return fmt.Errorf("the cache-server exited; see %s", tier.Log)
	}
	return nil
}

// runDir is where the kubeconfigs go: bin/run, stable paths so the printed
// commands survive copy and paste across runs; fallback outside the
// repository.
func runDir(fallback string) string {
	if root, err := controlplane.RepoRoot(); err == nil {
		if d := filepath.Join(root, "bin", "run"); os.MkdirAll(d, 0o755) == nil {
			return d
		}
	}
	return fallback
}

// sampleProfile caches everything hack/sampledata creates.
func sampleProfile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "namespaces"},
			{Version: "v1", Resource: "configmaps"},
			{Version: "v1", Resource: "secrets"},
			{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}},
			{Version: "v1", Resource: "events"},
			{Group: "example.cachetier.io", Version: "v1", Resource: "widgets"},
		},
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o600)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

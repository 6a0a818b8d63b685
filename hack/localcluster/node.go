package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// runNode is `make run CLUSTER=node NODES=n`: cachetier as users install
// it, on a real cluster of n nodes (hack/cluster) — the operator from the
// project's image with `kubectl apply -k config/default`, sample data, the
// sample profile from `kubectl apply -k config/samples` — then it prints
// the kubeconfigs and commands to try, and tears the cluster down on
// Ctrl-C.
func runNode(ctx context.Context, outDir string, nodes int) error {
	begin := time.Now()
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "cachetier-run-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	in, opts, err := nodeinstall.StartNodes(ctx, root, work, nodes, os.Stdout)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("tearing the cluster down")
		if err := in.Teardown(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	c, image := in.Cluster, in.Image
	took, err := in.InstallOperator(ctx, 3*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("kubectl apply -k config/default (image %s): manager Ready in %s\n", image.Ref, took.Round(100*time.Millisecond))
	if err := in.Seed(ctx, opts.PauseImage); err != nil {
		return fmt.Errorf("sample data: %w", err)
	}
	p, took, err := in.ApplySample(ctx, 5*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("kubectl apply -k config/samples: profile %s Available in %s; %s from nothing\n", p.Name, took.Round(100*time.Millisecond), time.Since(begin).Round(time.Second))

	kubeconfig := filepath.Join(outDir, "kubeconfig")
	if err := copyFile(c.AdminKubeconfig, kubeconfig); err != nil {
		return err
	}
	tierKubeconfig := filepath.Join(outDir, "kubeconfig-tier")
	if err := controlplane.RewriteKubeconfig(c.AdminKubeconfig, tierKubeconfig, p.Status.ServerURL, nil, ""); err != nil {
		return err
	}
	k := func(cfg string) string { return c.Kubectl() + " --kubeconfig " + cfg }
	ns := nodeinstall.CachedNamespaces
	var netns []string
	for _, n := range c.Addresses.Nodes {
		netns = append(netns, n.NetNS)
	}
	fmt.Printf(`
cachetier is installed on a real cluster of %[16]d node(s) (each a kubelet,
containerd, runc and kube-proxy in network namespace %[1]s; CoreDNS): the
operator and the fleet of profile %[2]s run as pods from image %[3]s.
  apiserver:  %[4]s (pods %[5]s, services %[6]s)
  tier:       %[7]s (the profile's status.serverURL)
  logs:       %[8]s/*.log

Kubeconfigs (admin):
  apiserver:  %[9]s
  tier:       %[10]s

Try (the same commands work with the apiserver kubeconfig, for comparison):
  %[11]s get cacheprofiles -o wide
  %[11]s get nodes -o wide
  %[11]s get pods -n %[12]s -o wide
  %[11]s describe cacheprofile %[2]s
  %[13]s get pods -A
  %[13]s get configmaps -n %[14]s -l app=b,tier=y
  %[13]s get pods -A --field-selector spec.nodeName=%[15]s
  %[13]s get certificates.cert-manager.io -A
  %[13]s get configmaps -A --chunk-size=50
  %[11]s logs -n %[12]s %[2]s-shard-0-0
  %[11]s delete pod -n %[12]s %[2]s-shard-0-0 && %[11]s get cacheprofile %[2]s -w
  %[11]s drain %[15]s --ignore-daemonsets --delete-emptydir-data && %[11]s uncordon %[15]s

Press Ctrl-C to stop; the cluster is torn down and nothing is left behind.
`, strings.Join(netns, ", "), p.Name, image.Ref, c.URL, c.Addresses.ClusterCIDR, c.Addresses.ServiceCIDR, p.Status.ServerURL, c.ControlPlane.Dir,
		kubeconfig, tierKubeconfig, k(kubeconfig), nodeinstall.OperatorNamespace, k(tierKubeconfig), ns[0], cluster.NodeName, len(c.Nodes))
	// Polled here, not in a goroutine of its own: the deferred teardown
	// changes the node's process list, which Exited reads.
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		if err := c.Exited(); err != nil {
			return err
		}
	}
}

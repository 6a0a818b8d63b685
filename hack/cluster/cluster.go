// Package cluster starts a real Kubernetes cluster of one or more nodes on
// this machine for end-to-end tests and `make run CLUSTER=node`: the control
// plane of hack/controlplane (etcd, kube-apiserver) plus
// kube-controller-manager and kube-scheduler, and per node containerd +
// runc, the kubelet, kube-proxy and the CNI bridge; CoreDNS as cluster DNS.
// Every one of them is the real program.
//
// The control plane and each node live in network namespaces of their own,
// as kind runs nodes in containers: a pod's 127.0.0.0/8 is its own
// loopback, so pods can reach neither a loopback ClusterIP nor an apiserver
// bound to the host's 127.0.0.1, and nodes must not share one. Addresses
// are carved from 100.64.0.0/10 (see PlanAddresses); the host reaches the
// apiserver, pods and ClusterIPs through one route. Images are imported,
// never pulled.
//
// Start fails fast, with the failing component's own log lines, when a
// component exits or never becomes ready; Stop removes every process,
// mount, interface, route and namespace the cluster made, and Leftovers
// proves it. StopNode and StartNode take a node down as a machine dies and
// bring it back (node.go).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// Image is an OCI image archive to import into each node's containerd.
type Image struct {
	Ref     string // the name pods use, e.g. ghcr.io/cachetier/cachetier:dev-0123456789ab
	Archive string // an OCI archive tar (hack/imagebuild writes them)
}

// Options configure a cluster.
type Options struct {
	// BinDir holds the Kubernetes binaries (kube-apiserver, kubectl, etcd,
	// kube-controller-manager, kube-scheduler, kubelet, kube-proxy).
	// Default: as hack/controlplane finds it.
	BinDir string
	// Dir holds all of the cluster's state; default a new temporary
	// directory. Stop removes it either way: it must not hold anything else.
	Dir string
	// Nodes is how many nodes run (1 to MaxNodes; default 1).
	Nodes int
	// Images are imported into every node before its kubelet starts.
	Images []Image
	// PauseImage is the sandbox image (its ref, among Images).
	PauseImage string
	// CoreDNSImage runs the cluster DNS (its ref, among Images).
	CoreDNSImage string
	// ExtraKubeletArgs are appended to every kubelet's command line (flags
	// override its config file).
	ExtraKubeletArgs []string
	// ReadyTimeout bounds each wait: a node turning Ready, a pod turning
	// Ready. Default 2 minutes.
	ReadyTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Cluster is a running cluster.
type Cluster struct {
	// Addresses is the cluster's address plan.
	Addresses Addresses
	// Dir holds everything the cluster keeps on disk: the control plane's
	// directory and one per node.
	Dir string
	// ControlPlane is etcd + kube-apiserver, in the control plane's
	// namespace; it also runs the controllers' and the nodes' processes.
	*controlplane.ControlPlane
	// Nodes are the cluster's nodes, node j at index j.
	Nodes []*Node

	opts         Options
	slot         *slot
	hostIPTables string
	log          io.Writer
	stopOnce     sync.Once
	stopErr      error
}

// Component process names, as they appear in logs and errors; a node's
// carry its name (see Node.proc).
const (
	procControllerManager = "kube-controller-manager"
	procScheduler         = "kube-scheduler"
	procContainerd        = "containerd"
	procKubelet           = "kubelet"
	procKubeProxy         = "kube-proxy"
)

// Start brings a cluster up and returns when every node is Ready and
// cluster DNS answers. On error everything started is removed again.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = controlplane.FindBinDir(); err != nil {
			return nil, err
		}
	}
	if err := CheckPrerequisites(opts.BinDir); err != nil {
		return nil, err
	}
	if opts.PauseImage == "" || opts.CoreDNSImage == "" {
		return nil, errors.New("cluster: PauseImage and CoreDNSImage must be set (hack/imagebuild builds both)")
	}
	for _, img := range opts.Images {
		if _, err := os.Stat(img.Archive); err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Ref, err)
		}
	}

	c = &Cluster{opts: opts, log: opts.Log}
	s, abandoned, err := acquireSlot()
	if err != nil {
		return nil, err
	}
	c.slot = s
	if c.Addresses, err = PlanAddresses(s.index, opts.Nodes); err != nil {
		_ = s.release()
		return nil, err
	}
	// A run that died without cleaning up (a test binary killed by its
	// timeout runs no deferred code) left its slot's namespaces, mounts and
	// processes behind: remove them before reusing the addresses.
	if abandoned.Dir != "" || len(slotNamespaces(s.index)) > 0 || linkExists(c.Addresses.ControlPlane.HostVeth) {
		fmt.Fprintf(c.log, "cluster slot %d: removing what an earlier run (pid %d, dir %q) left behind\n", s.index, abandoned.PID, abandoned.Dir)
		if err := cleanupLocal(ctx, c.Addresses, abandoned.Dir); err != nil {
			_ = s.release()
			return nil, fmt.Errorf("clean up abandoned cluster in slot %d: %w", s.index, err)
		}
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "cachetier-cluster-"); err != nil {
			_ = s.release()
			return nil, err
		}
	}
	c.Dir = opts.Dir
	if err := s.record(slotRecord{Dir: opts.Dir, PID: os.Getpid()}); err != nil {
		_ = s.release()
		return nil, err
	}
	c.hostIPTables = hostIPTablesRules(ctx)
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, stopErr)
			}
			c = nil
		}
	}()
	for j, a := range c.Addresses.Nodes {
		c.Nodes = append(c.Nodes, &Node{Name: a.Name, Index: j, Addresses: a, Layout: Layout{Dir: filepath.Join(c.Dir, a.Name)}, c: c})
	}

	start := time.Now()
	if err := setupNetwork(ctx, c.Addresses); err != nil {
		return c, fmt.Errorf("cluster network: %w", err)
	}
	cpa := c.Addresses.ControlPlane
	c.ControlPlane, err = controlplane.Start(ctx, controlplane.Options{
		BinDir:                opts.BinDir,
		Dir:                   filepath.Join(c.Dir, "controlplane"),
		ServiceClusterIPRange: c.Addresses.ServiceCIDR.String(),
		NetNS:                 cpa.NetNSPath(),
		AdvertiseAddress:      cpa.HubIP,
		ForNode:               true,
		Log:                   c.log,
	})
	if err != nil {
		return c, err
	}
	if err := c.startControllers(); err != nil {
		return c, err
	}
	// The control plane's own kube-proxy: the aggregator dials an
	// APIService's Service by its ClusterIP, as on a kubeadm control-plane
	// node, and the host reaches ClusterIPs through this namespace.
	if err := c.startKubeProxy(procKubeProxy, cpa.NetNSPath(), controlPlaneNodeName, cpa.HubIP, filepath.Join(c.Dir, "controlplane", "kube-proxy-config.yaml")); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := n.start(ctx, true); err != nil {
			return c, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.waitReady(ctx, start); err != nil {
			return c, err
		}
	}
	fmt.Fprintf(c.log, "%d node(s) Ready after %s\n", len(c.Nodes), time.Since(start).Round(time.Millisecond))
	if err := c.deployDNS(ctx); err != nil {
		return c, err
	}
	fmt.Fprintf(c.log, "cluster ready after %s: apiserver %s, nodes %s, pods %s, services %s, dir %s\n",
		time.Since(start).Round(time.Millisecond), c.URL, strings.Join(c.NodeNames(), " "), c.Addresses.ClusterCIDR, c.Addresses.ServiceCIDR, c.Dir)
	return c, nil
}

// NodeNames are the names of the cluster's nodes.
func (c *Cluster) NodeNames() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// nodeNamed is Node, with an error naming the cluster's nodes when there
// is none called name.
func (c *Cluster) nodeNamed(name string) (*Node, error) {
	if n := c.Node(name); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("no node %q (nodes: %s)", name, strings.Join(c.NodeNames(), ", "))
}

// Clientset returns an admin client.
func (c *Cluster) Clientset() (*kubernetes.Clientset, *rest.Config, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, cfg, err
}

// CheckPrerequisites reports every missing binary at once, with what
// provides it, rather than failing on the first one mid-start.
func CheckPrerequisites(binDir string) error {
	var missing []string
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s (run `make controlplane`)", filepath.Join(binDir, b)))
		}
	}
	debian := map[string]string{
		"containerd": "containerd", "ctr": "containerd", "runc": "runc",
		"iptables": "iptables", "ip": "iproute2", "nsenter": "util-linux", "conntrack": "conntrack",
	}
	for _, b := range []string{"containerd", "ctr", "runc", "iptables", "ip", "nsenter", "conntrack"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package %s)", b, debian[b]))
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, fmt.Sprintf("%s (Debian package containernetworking-plugins)", filepath.Join(CNIBinDir, p)))
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces, mounts and containers need it)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot start a node; missing (`make node-deps` installs the Debian packages):\n  %s", strings.Join(missing, "\n  "))
	}
	return nil
}

// componentKubeconfig issues a client certificate for a component's user
// and writes its kubeconfig.
func (c *Cluster) componentKubeconfig(user string, groups ...string) (string, error) {
	return c.UserKubeconfig(user, groups...)
}

func (c *Cluster) startControllers() error {
	kcm, err := c.componentKubeconfig("system:kube-controller-manager")
	if err != nil {
		return err
	}
	pki := c.PKI
	_, _, err = c.StartProcess(procControllerManager, filepath.Join(c.opts.BinDir, "kube-controller-manager"),
		"--kubeconfig="+kcm,
		"--authentication-kubeconfig="+kcm,
		"--authorization-kubeconfig="+kcm,
		"--bind-address=127.0.0.1",
		"--secure-port=10257",
		"--leader-elect=false",
		// Every controller its own ServiceAccount, as kubeadm runs it, so
		// the bootstrap RBAC roles are what is exercised.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+pki.ServiceAccountKey,
		"--root-ca-file="+pki.ClusterCA,
		"--cluster-signing-cert-file="+pki.ClusterCA,
		"--cluster-signing-key-file="+pki.ClusterCAKey,
		"--controllers=*",
		"--v=1",
	)
	if err != nil {
		return err
	}
	sched, err := c.componentKubeconfig("system:kube-scheduler")
	if err != nil {
		return err
	}
	_, _, err = c.StartProcess(procScheduler, filepath.Join(c.opts.BinDir, "kube-scheduler"),
		"--kubeconfig="+sched,
		"--authentication-kubeconfig="+sched,
		"--authorization-kubeconfig="+sched,
		"--bind-address=127.0.0.1",
		"--secure-port=10259",
		"--leader-elect=false",
		"--v=1",
	)
	return err
}

// LogPath is the log file of a control plane component
// (kube-controller-manager, kube-scheduler, kube-proxy, kube-apiserver,
// etcd); Node.LogPath has the nodes' components.
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.ControlPlane.Dir, component+".log")
}

// startKubeProxy runs a kube-proxy in the namespace netns (a path) as
// nodeName, bound to bind.
func (c *Cluster) startKubeProxy(proc, netns, nodeName string, bind net.IP, configPath string) error {
	kubeconfig, err := c.componentKubeconfig("system:kube-proxy")
	if err != nil {
		return err
	}
	cfg, err := RenderKubeProxyConfig(c.Addresses.ClusterCIDR, nodeName, bind, kubeconfig)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(configPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(configPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	_, _, err = c.StartProcessIn(netns, proc, filepath.Join(c.opts.BinDir, "kube-proxy"), "--config="+configPath, "--v=1")
	return err
}

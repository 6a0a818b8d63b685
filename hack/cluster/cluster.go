// Package cluster starts a real one-node Kubernetes cluster on this machine
// for end-to-end tests and `make run CLUSTER=node`: the control plane of
// hack/controlplane (etcd, kube-apiserver) plus kube-controller-manager,
// kube-scheduler, containerd + runc, the kubelet, kube-proxy, the CNI bridge
// and CoreDNS, every one of them the real program.
//
// The node lives in a network namespace of its own, as kind runs a node in a
// container: a pod's 127.0.0.0/8 is its own loopback, so pods can reach
// neither a loopback ClusterIP nor an apiserver bound to the host's
// 127.0.0.1. Its addresses are carved from 100.64.0.0/10 (see
// PlanAddresses); the host reaches the apiserver, pods and ClusterIPs
// through one route. Images are imported, never pulled.
//
// Start fails fast, with the failing component's own log lines, when a
// component exits or never becomes ready; Stop removes every process, mount,
// interface, route and namespace the cluster made, and Leftovers proves it.
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

// Image is an OCI image archive to import into the node's containerd.
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
	// Dir holds all of the node's state; default a new temporary
	// directory. Stop removes it either way: it must not hold anything else.
	Dir string
	// Images are imported into the node before the kubelet starts.
	Images []Image
	// PauseImage is the sandbox image (its ref, among Images).
	PauseImage string
	// CoreDNSImage runs the cluster DNS (its ref, among Images).
	CoreDNSImage string
	// ExtraKubeletArgs are appended to the kubelet's command line (flags
	// override its config file).
	ExtraKubeletArgs []string
	// ReadyTimeout bounds each wait: the node turning Ready, a pod turning
	// Ready. Default 2 minutes.
	ReadyTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Cluster is a running one-node cluster.
type Cluster struct {
	// Addresses is the node's address plan.
	Addresses Addresses
	// Layout is where the node keeps its files.
	Layout Layout
	// ControlPlane is etcd + kube-apiserver, in the node's namespace.
	*controlplane.ControlPlane

	opts         Options
	slot         *slot
	hostIPTables string
	log          io.Writer
	stopOnce     sync.Once
	stopErr      error
}

// Component process names, as they appear in logs and errors.
const (
	procControllerManager = "kube-controller-manager"
	procScheduler         = "kube-scheduler"
	procContainerd        = "containerd"
	procKubelet           = "kubelet"
	procKubeProxy         = "kube-proxy"
)

// Start brings a one-node cluster up and returns when the node is Ready and
// cluster DNS answers. On error everything started is removed again.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 2 * time.Minute
	}
	if opts.Log == nil {
		opts.Log = io.Discard
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
	if c.Addresses, err = PlanAddresses(s.index); err != nil {
		_ = s.release()
		return nil, err
	}
	// A run that died without cleaning up (a test binary killed by its
	// timeout runs no deferred code) left its slot's namespace, mounts and
	// processes behind: remove them before reusing the addresses.
	if abandoned.Dir != "" || namespaceExists(c.Addresses) {
		fmt.Fprintf(c.log, "cluster slot %d: removing what an earlier run (pid %d, dir %q) left behind\n", s.index, abandoned.PID, abandoned.Dir)
		if err := cleanupLocal(ctx, c.Addresses, abandoned.Dir); err != nil {
			_ = s.release()
			return nil, fmt.Errorf("clean up abandoned cluster in slot %d: %w", s.index, err)
		}
	}
	if opts.Dir == "" {
		if opts.Dir, err = os.MkdirTemp("", "cachetier-node-"); err != nil {
			_ = s.release()
			return nil, err
		}
	}
	c.Layout = Layout{Dir: opts.Dir}
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

	start := time.Now()
	if err := setupNetwork(ctx, c.Addresses); err != nil {
		return c, fmt.Errorf("node network: %w", err)
	}
	c.ControlPlane, err = controlplane.Start(ctx, controlplane.Options{
		BinDir:                opts.BinDir,
		Dir:                   c.Layout.path("controlplane"),
		ServiceClusterIPRange: c.Addresses.ServiceCIDR.String(),
		NetNS:                 c.Addresses.NetNSPath(),
		AdvertiseAddress:      c.Addresses.NodeIP,
		ForNode:               true,
		Log:                   c.log,
	})
	if err != nil {
		return c, err
	}
	if err := c.startControllers(); err != nil {
		return c, err
	}
	if err := c.startContainerd(ctx); err != nil {
		return c, err
	}
	if err := c.importImages(ctx); err != nil {
		return c, err
	}
	if err := c.startKubelet(); err != nil {
		return c, err
	}
	if err := c.startKubeProxy(); err != nil {
		return c, err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return c, err
	}
	fmt.Fprintf(c.log, "node %s Ready after %s\n", NodeName, time.Since(start).Round(time.Millisecond))
	if err := c.deployDNS(ctx); err != nil {
		return c, err
	}
	fmt.Fprintf(c.log, "cluster ready after %s: apiserver %s, pods %s, services %s, dir %s\n",
		time.Since(start).Round(time.Millisecond), c.URL, c.Addresses.PodCIDR, c.Addresses.ServiceCIDR, c.Layout.Dir)
	return c, nil
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

func (c *Cluster) startContainerd(ctx context.Context) error {
	l := c.Layout
	for _, d := range []string{filepath.Dir(l.ContainerdConfig()), l.CNIConfDir(), l.CNIIPAMDir(), l.KubeletRoot(), l.PodLogs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(l.ContainerdConfig(), []byte(RenderContainerdConfig(l, c.opts.PauseImage)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(l.CNIConfDir(), "10-cachetier.conflist"), []byte(RenderCNIConfig(l, c.Addresses)), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(l.RegistryHostsFile()), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(l.RegistryHostsFile(), []byte(RenderRegistryHosts()), 0o644); err != nil {
		return err
	}
	if _, _, err := c.StartProcess(procContainerd, "containerd", "--config="+l.ContainerdConfig(), "--log-level=info"); err != nil {
		return err
	}
	return waitFor(ctx, "containerd to answer on "+l.ContainerdSocket(), 30*time.Second, c.Exited,
		func(ctx context.Context) (string, bool) {
			out, err := c.ctr(ctx, "version")
			if err != nil {
				return strings.TrimSpace(string(out)) + ": " + err.Error(), false
			}
			return "", true
		}, nil)
}

// ctr runs containerd's CLI against the node's containerd, in the
// namespace the CRI plugin uses.
func (c *Cluster) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", c.Layout.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

func (c *Cluster) importImages(ctx context.Context) error {
	for _, img := range c.opts.Images {
		start := time.Now()
		out, err := c.ctr(ctx, "images", "import", "--no-unpack=false", img.Archive)
		if err != nil {
			return fmt.Errorf("import image %s from %s: %w: %s", img.Ref, img.Archive, err, out)
		}
		// The archive's name annotation decides what the image is called;
		// a mismatch would only show later as a pod that cannot start.
		if out, err := c.ctr(ctx, "images", "check", "name=="+img.Ref); err != nil || !strings.Contains(string(out), img.Ref) {
			listed, _ := c.ctr(ctx, "images", "ls", "-q")
			return fmt.Errorf("image %s not in the node after importing %s (err %v); the node has:\n%s", img.Ref, img.Archive, err, listed)
		}
		fmt.Fprintf(c.log, "imported %s in %s\n", img.Ref, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func (c *Cluster) startKubelet() error {
	l, a := c.Layout, c.Addresses
	kubeconfig, err := c.componentKubeconfig("system:node:"+NodeName, "system:nodes")
	if err != nil {
		return err
	}
	serving, err := c.ClusterCA.IssueServing(NodeName, []string{NodeName}, []net.IP{a.NodeIP})
	if err != nil {
		return err
	}
	cert, key, err := serving.WriteFiles(filepath.Join(c.PKI.Dir, "kubelet"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(l.ResolvConf(), []byte(RenderResolvConf(a)), 0o644); err != nil {
		return err
	}
	cfg, err := RenderKubeletConfig(l, a, KubeletFiles{ClientCAFile: c.PKI.ClusterCA, TLSCertFile: cert, TLSKeyFile: key})
	if err != nil {
		return err
	}
	if err := os.WriteFile(l.KubeletConfig(), []byte(cfg), 0o644); err != nil {
		return err
	}
	args := []string{
		"--config=" + l.KubeletConfig(),
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + l.KubeletRoot(),
		"--cert-dir=" + filepath.Join(l.KubeletRoot(), "pki"),
		"--node-ip=" + a.NodeIP.String(),
		"--hostname-override=" + NodeName,
		"--v=2",
	}
	_, _, err = c.StartProcess(procKubelet, filepath.Join(c.opts.BinDir, "kubelet"), append(args, c.opts.ExtraKubeletArgs...)...)
	return err
}

func (c *Cluster) startKubeProxy() error {
	kubeconfig, err := c.componentKubeconfig("system:kube-proxy")
	if err != nil {
		return err
	}
	cfg, err := RenderKubeProxyConfig(c.Addresses, kubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.Layout.KubeProxyConfig(), []byte(cfg), 0o644); err != nil {
		return err
	}
	_, _, err = c.StartProcess(procKubeProxy, filepath.Join(c.opts.BinDir, "kube-proxy"),
		"--config="+c.Layout.KubeProxyConfig(), "--v=1")
	return err
}

// LogPath is a component's log file (kubelet, containerd, ...).
func (c *Cluster) LogPath(component string) string {
	return filepath.Join(c.Layout.path("controlplane"), component+".log")
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/proctree"
)

// Node is one node of a cluster: containerd, the kubelet and kube-proxy in
// a network namespace of its own, with its files under Layout.Dir.
type Node struct {
	// Name is the Node's name; Index its place in Cluster.Nodes.
	Name  string
	Index int
	// Addresses is the node's part of the address plan.
	Addresses NodeAddresses
	// Layout is where the node keeps its files.
	Layout Layout

	c *Cluster
	// mu guards down: StopNode and StartNode may be called while Stop
	// tears the cluster down from a test's cleanup.
	mu   sync.Mutex
	down bool
}

// proc is the process name of one of the node's components: its log file
// is <control plane dir>/<component>@<node>.log.
func (n *Node) proc(component string) string { return component + "@" + n.Name }

// LogPath is the log file of one of the node's components (kubelet,
// containerd, kube-proxy).
func (n *Node) LogPath(component string) string {
	return filepath.Join(n.c.ControlPlane.Dir, n.proc(component)+".log")
}

// Down says whether the node is stopped (StopNode) and not started again.
func (n *Node) Down() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down
}

// start writes the node's configuration (first start only: a restarted
// node finds its files, as a machine that boots again finds its disk) and
// starts containerd, imports the images (first start only: they survive in
// containerd's root), then the kubelet and kube-proxy.
func (n *Node) start(ctx context.Context, first bool) error {
	c, l, a := n.c, n.Layout, n.Addresses
	if first {
		for _, d := range []string{filepath.Dir(l.ContainerdConfig()), l.CNIConfDir(), l.CNIIPAMDir(), l.KubeletRoot(), l.PodLogs(), filepath.Dir(l.RegistryHostsFile())} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		files := map[string]string{
			l.ContainerdConfig(): RenderContainerdConfig(l, c.opts.PauseImage),
			filepath.Join(l.CNIConfDir(), "10-cachetier.conflist"): RenderCNIConfig(l, a),
			l.RegistryHostsFile(): RenderRegistryHosts(),
			l.ResolvConf():        RenderResolvConf(c.Addresses.DNSServiceIP),
		}
		for path, content := range files {
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				return err
			}
		}
		if err := n.writeKubeletConfig(); err != nil {
			return err
		}
	}
	if _, _, err := c.StartProcessIn(a.NetNSPath(), n.proc(procContainerd), "containerd", "--config="+l.ContainerdConfig(), "--log-level=info"); err != nil {
		return err
	}
	if err := waitFor(ctx, n.Name+"'s containerd to answer on "+l.ContainerdSocket(), 30*time.Second, c.Exited,
		func(ctx context.Context) (string, bool) {
			out, err := n.ctr(ctx, "version")
			if err != nil {
				return strings.TrimSpace(string(out)) + ": " + err.Error(), false
			}
			return "", true
		}, nil); err != nil {
		return err
	}
	if first {
		if err := n.importImages(ctx); err != nil {
			return err
		}
	}
	args := []string{
		"--config=" + l.KubeletConfig(),
		"--kubeconfig=" + n.kubeletKubeconfig(),
		"--root-dir=" + l.KubeletRoot(),
		"--cert-dir=" + filepath.Join(l.KubeletRoot(), "pki"),
		"--node-ip=" + a.IP.String(),
		"--hostname-override=" + n.Name,
		"--v=2",
	}
	if _, _, err := c.StartProcessIn(a.NetNSPath(), n.proc(procKubelet), filepath.Join(c.opts.BinDir, "kubelet"), append(args, c.opts.ExtraKubeletArgs...)...); err != nil {
		return err
	}
	return c.startKubeProxy(n.proc(procKubeProxy), a.NetNSPath(), n.Name, a.IP, l.KubeProxyConfig())
}

func (n *Node) kubeletKubeconfig() string { return filepath.Join(n.Layout.Dir, "kubelet.kubeconfig") }

// writeKubeletConfig issues the kubelet's client and serving certificates
// and writes its kubeconfig and KubeletConfiguration.
func (n *Node) writeKubeletConfig() error {
	c, l, a := n.c, n.Layout, n.Addresses
	kubeconfig, err := c.componentKubeconfig("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	if err := os.Rename(kubeconfig, n.kubeletKubeconfig()); err != nil {
		return err
	}
	serving, err := c.ClusterCA.IssueServing(n.Name, []string{n.Name}, []net.IP{a.IP})
	if err != nil {
		return err
	}
	cert, key, err := serving.WriteFiles(filepath.Join(l.Dir, "kubelet-serving"))
	if err != nil {
		return err
	}
	cfg, err := RenderKubeletConfig(l, a, c.Addresses.DNSServiceIP, KubeletFiles{ClientCAFile: c.PKI.ClusterCA, TLSCertFile: cert, TLSKeyFile: key})
	if err != nil {
		return err
	}
	return os.WriteFile(l.KubeletConfig(), []byte(cfg), 0o644)
}

// ctr runs containerd's CLI against the node's containerd, in the
// namespace the CRI plugin uses.
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", n.Layout.ContainerdSocket(), "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

func (n *Node) importImages(ctx context.Context) error {
	for _, img := range n.c.opts.Images {
		start := time.Now()
		out, err := n.ctr(ctx, "images", "import", "--no-unpack=false", img.Archive)
		if err != nil {
			return fmt.Errorf("%s: import image %s from %s: %w: %s", n.Name, img.Ref, img.Archive, err, out)
		}
		// The archive's name annotation decides what the image is called;
		// a mismatch would only show later as a pod that cannot start.
		if out, err := n.ctr(ctx, "images", "check", "name=="+img.Ref); err != nil || !strings.Contains(string(out), img.Ref) {
			listed, _ := n.ctr(ctx, "images", "ls", "-q")
			return fmt.Errorf("image %s not in %s after importing %s (err %v); the node has:\n%s", img.Ref, n.Name, img.Archive, err, listed)
		}
		fmt.Fprintf(n.c.log, "%s: imported %s in %s\n", n.Name, img.Ref, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// waitReady waits until the Node reports Ready from a heartbeat at or
// after since (a restarted kubelet's, not the status its predecessor left),
// failing at once when one of the cluster's processes exits.
func (n *Node) waitReady(ctx context.Context, since time.Time) error {
	cs, _, err := n.c.Clientset()
	if err != nil {
		return err
	}
	return waitFor(ctx, "node "+n.Name+" Ready", n.c.opts.ReadyTimeout, n.c.Exited,
		func(ctx context.Context) (string, bool) {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err.Error(), false
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					fresh := !cond.LastHeartbeatTime.Time.Before(since.Truncate(time.Second))
					return fmt.Sprintf("Ready=%s %s: %s (heartbeat %s)", cond.Status, cond.Reason, cond.Message, cond.LastHeartbeatTime.Format(time.RFC3339)),
						cond.Status == corev1.ConditionTrue && fresh
				}
			}
			return "no Ready condition yet", false
		},
		func(context.Context) string {
			return n.Name + "'s kubelet log:\n" + controlplane.LogTail(n.LogPath(procKubelet), 40) +
				"\n" + n.Name + "'s containerd log:\n" + controlplane.LogTail(n.LogPath(procContainerd), 15)
		})
}

// StopNode takes the node down as a machine dies, not as it is drained:
// its kubelet, containerd, kube-proxy and every container process are
// killed at once (SIGKILL), what lived in memory (mounts, the pods'
// network namespaces, containerd's and runc's state — the node's /run) is
// gone, and
// its cable is pulled: the node's port on the hub goes down, so packets
// to it and its pods are lost without an answer. Nothing is told to the
// apiserver; the Node turns NotReady only when the node lifecycle
// controller notices that its kubelet stopped renewing its lease.
func (c *Cluster) StopNode(ctx context.Context, name string) error {
	n, err := c.nodeNamed(name)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.down {
		return fmt.Errorf("node %s is already stopped", name)
	}
	n.down = true
	// The cable first: nothing the dying node sends gets out.
	err = setNodeLink(ctx, c.Addresses, n.Addresses, false)
	for _, comp := range []string{procKubelet, procKubeProxy, procContainerd} {
		c.KillProcess(n.proc(comp))
	}
	err = errors.Join(err, killProcessesUsing(n.Layout.Dir), unmountUnder(n.Layout.Dir),
		os.RemoveAll(n.Layout.ContainerdState()), os.RemoveAll(n.Layout.RuncRoot()))
	fmt.Fprintf(c.log, "node %s stopped: processes killed, network silent\n", name)
	return err
}

// StartNode boots a node StopNode took down: the same name and addresses,
// its cable plugged in, containerd, the kubelet and kube-proxy started
// from the files the node kept. It returns once the Node is Ready again.
func (c *Cluster) StartNode(ctx context.Context, name string) error {
	n, err := c.nodeNamed(name)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.down {
		return fmt.Errorf("node %s is running", name)
	}
	start := time.Now()
	if err := setNodeLink(ctx, c.Addresses, n.Addresses, true); err != nil {
		return err
	}
	if err := n.start(ctx, false); err != nil {
		return err
	}
	n.down = false
	if err := n.waitReady(ctx, start); err != nil {
		return err
	}
	fmt.Fprintf(c.log, "node %s started again: Ready after %s\n", name, time.Since(start).Round(time.Millisecond))
	return nil
}

// Memory is the resident memory of the node's processes by part: the
// kubelet, containerd, kube-proxy, and its pods (the containerd shims and
// every container process), read from /proc. Resident pages shared between
// processes count once per process, so the sum is an upper bound.
func (n *Node) Memory() map[string]uint64 {
	procs := proctree.Read()
	out := map[string]uint64{}
	for _, pid := range processesUsing(procs, n.Layout.Dir) {
		part := "pods"
		for _, comp := range []string{procKubelet, procKubeProxy, procContainerd} {
			if p := procs[pid]; strings.Contains(p.Cmdline, "/"+comp+" ") || strings.HasPrefix(p.Cmdline, comp+" ") {
				part = comp
			}
		}
		out[part] += rss(pid)
	}
	return out
}

// rss is a process's resident set size in bytes (0 when it is gone).
func rss(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0
	}
	var size, resident uint64
	if _, err := fmt.Sscan(string(data), &size, &resident); err != nil {
		return 0
	}
	return resident * uint64(os.Getpagesize())
}

package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/hack/proctree"
)

// Stop tears the cluster down in the order that leaves nothing behind:
// controllers first (so nothing recreates pods), then every pod through its
// kubelet (so CNI releases addresses and containerd removes sandboxes and
// their mounts; pods of a stopped node have no kubelet and are deleted at
// once), each node's kube-proxy, kubelet and containerd, the control
// plane, whatever still runs from or is mounted under the cluster's
// directory (containerd's shims and the containers), the network
// namespaces (their interfaces and iptables rules go with them), the
// host's uplink and route, and the directory. Safe to call twice; it
// carries on after errors and reports them all.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var errs []error
		if c.ControlPlane != nil {
			errs = append(errs, c.StopProcess(procControllerManager), c.StopProcess(procScheduler))
			if err := c.deleteAllPods(ctx); err != nil {
				errs = append(errs, err)
			}
			for _, n := range c.Nodes {
				for _, comp := range []string{procKubeProxy, procKubelet, procContainerd} {
					errs = append(errs, c.StopProcess(n.proc(comp)))
				}
			}
			// Last, with the rest of the control plane: before the sweep
			// below, since etcd and kube-apiserver run from a directory
			// under the cluster's and would be killed, not stopped.
			errs = append(errs, c.ControlPlane.Stop())
		}
		errs = append(errs, killProcessesUsing(c.Dir), unmountUnder(c.Dir))
		errs = append(errs, teardownNetwork(ctx, c.Addresses))
		if c.Dir != "" {
			errs = append(errs, os.RemoveAll(c.Dir))
		}
		if c.slot != nil {
			errs = append(errs, c.slot.release())
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}

// deleteAllPods deletes every pod and waits until the kubelets have stopped
// them all (a kubelet removes a pod's object only after its containers are
// gone). Pods of a stopped node, which no kubelet will confirm, and pods
// never scheduled are removed at once.
func (c *Cluster) deleteAllPods(ctx context.Context) error {
	cs, _, err := c.Clientset()
	if err != nil {
		return err
	}
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	for _, p := range pods.Items {
		grace := int64(2)
		if n := c.Node(p.Spec.NodeName); n == nil || n.Down() {
			grace = 0
		}
		_ = cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	}
	// c.Exited: a kubelet (or apiserver) that died stops no pod; say so
	// at once rather than after the minute.
	return waitFor(ctx, "every pod stopped by its kubelet", time.Minute, c.Exited,
		func(ctx context.Context) (string, bool) {
			pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err.Error(), false
			}
			var left []string
			for _, p := range pods.Items {
				left = append(left, p.Namespace+"/"+p.Name+" on "+p.Spec.NodeName)
			}
			return strings.Join(left, ", ") + " left", len(left) == 0
		}, nil)
}

// cleanupLocal removes what a cluster in the slot left on this machine
// without any help from its API: processes, mounts, the network, the
// directory. It is how a run that died is cleaned up by the next one.
func cleanupLocal(ctx context.Context, a Addresses, dir string) error {
	var errs []error
	if dir != "" {
		errs = append(errs, killProcessesUsing(dir), unmountUnder(dir))
	}
	errs = append(errs, teardownNetwork(ctx, a))
	if dir != "" {
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// killProcessesUsing kills every process whose command line names dir (each
// component is started with its files there, containerd's shims with its
// socket) and everything those processes started (the containers, which the
// shims reparent to themselves), children first.
func killProcessesUsing(dir string) error {
	procs := proctree.Read()
	order := processesUsing(procs, dir)
	if len(order) == 0 {
		return nil
	}
	for _, pid := range order {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range order {
		for proctree.Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	var alive []string
	for _, pid := range order {
		if proctree.Alive(pid) {
			alive = append(alive, fmt.Sprintf("%d (%s)", pid, procs[pid].Cmdline))
		}
	}
	if len(alive) > 0 {
		return fmt.Errorf("processes still alive after SIGKILL: %s", strings.Join(alive, ", "))
	}
	return nil
}

// processesUsing lists the processes whose command line names dir and
// every process they started, children before parents.
func processesUsing(procs proctree.Table, dir string) []int {
	if dir == "" {
		return nil
	}
	needle := strings.TrimRight(dir, "/") + "/"
	var roots []int
	for pid, p := range procs {
		if pid != os.Getpid() && strings.Contains(p.Cmdline, needle) {
			roots = append(roots, pid)
		}
	}
	return procs.Tree(roots...)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	if dir == "" {
		return nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount below dir (pod volumes, container root
// filesystems, sandbox network namespaces and shm), deepest first.
func unmountUnder(dir string) error {
	var errs []error
	for pass := 0; pass < 3; pass++ {
		mps := mountsUnder(dir)
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %s", strings.Join(left, ", ")))
	}
	return errors.Join(errs...)
}

// hostIPTablesRules is the host's own ruleset (filter and nat). Every rule
// the node's components write belongs in the node's namespace; comparing
// this before and after proves none leaked to the host.
func hostIPTablesRules(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "iptables-save").Output()
	if err != nil {
		return "iptables-save: " + err.Error()
	}
	var keep []string
	for _, line := range strings.Split(string(out), "\n") {
		// Comments carry timestamps; counters change with traffic.
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.HasPrefix(line, ":") {
			if i := strings.LastIndexByte(line, '['); i > 0 {
				line = strings.TrimSpace(line[:i])
			}
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "\n")
}

// Leftovers lists what the cluster left on this machine after Stop: running
// processes that name its directory (every node's lives below it), mounts
// under it, the directory itself, the network namespaces of the control
// plane and of every node, the host's uplink and route, and host iptables
// rules that differ from before Start. Empty means a clean teardown.
func (c *Cluster) Leftovers(ctx context.Context) []string {
	var out []string
	dir := c.Dir
	needle := strings.TrimRight(dir, "/") + "/"
	for pid, p := range proctree.Read() {
		if pid != os.Getpid() && dir != "" && strings.Contains(p.Cmdline, needle) {
			out = append(out, fmt.Sprintf("process %d: %s", pid, p.Cmdline))
		}
	}
	for _, mp := range mountsUnder(dir) {
		out = append(out, "mount "+mp)
	}
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	for _, ns := range slotNamespaces(c.Addresses.Slot) {
		out = append(out, "network namespace "+ns)
	}
	if linkExists(c.Addresses.ControlPlane.HostVeth) {
		out = append(out, "interface "+c.Addresses.ControlPlane.HostVeth)
	}
	if routes, err := exec.CommandContext(ctx, "ip", "route", "show", c.Addresses.Block.String()).Output(); err == nil && strings.TrimSpace(string(routes)) != "" {
		out = append(out, "route "+strings.TrimSpace(string(routes)))
	}
	if now := hostIPTablesRules(ctx); now != c.hostIPTables {
		out = append(out, fmt.Sprintf("host iptables changed:\nbefore:\n%s\nafter:\n%s", c.hostIPTables, now))
	}
	return out
}

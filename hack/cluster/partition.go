package cluster

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// BlockAPIServer cuts the given pods of node off the apiserver as a
// network partition would: what they send to it is dropped in the node's
// namespace, without an answer, so new connections time out and the
// established ones (their watches) go silent. It matches after
// kube-proxy's DNAT (the `kubernetes` Service's ClusterIP already
// rewritten to the apiserver's advertise address and port), in the
// forward path of the node's namespace, so the kubelet, the aggregator's
// calls into the pods and pod-to-pod traffic are untouched: only those
// pods lose the apiserver. The returned unblock lifts it.
func (c *Cluster) BlockAPIServer(ctx context.Context, node string, podIPs []string) (unblock func(context.Context) error, err error) {
	n, err := c.nodeNamed(node)
	if err != nil {
		return nil, err
	}
	if len(podIPs) == 0 {
		return nil, fmt.Errorf("no pod to cut off the apiserver")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, err
	}
	_, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's URL %q: %w", c.URL, err)
	}
	rule := func(op, ip string) []string {
		return []string{"nsenter", "--net=" + n.Addresses.NetNSPath(), "--", "iptables", "-w", op, "FORWARD",
			"-s", ip, "-d", c.Addresses.ControlPlane.HubIP.String(), "-p", "tcp", "--dport", port, "-j", "DROP"}
	}
	var added []string
	unblock = func(ctx context.Context) error {
		var errs []string
		for _, ip := range added {
			if err := run(ctx, rule("-D", ip)...); err != nil {
				errs = append(errs, err.Error())
			}
		}
		added = nil
		if len(errs) > 0 {
			return fmt.Errorf("lift the apiserver block: %s", strings.Join(errs, "; "))
		}
		fmt.Fprintf(c.log, "node %s: pods %s reach the apiserver again\n", node, strings.Join(podIPs, ", "))
		return nil
	}
	for _, ip := range podIPs {
		if net.ParseIP(ip) == nil {
			_ = unblock(ctx)
			return nil, fmt.Errorf("pod IP %q is not an IP address", ip)
		}
		// Inserted first: kube-proxy's KUBE-FORWARD accepts established
		// connections, which must go silent too.
		if err := run(ctx, rule("-I", ip)...); err != nil {
			_ = unblock(ctx)
			return nil, err
		}
		added = append(added, ip)
	}
	fmt.Fprintf(c.log, "node %s: pods %s cut off the apiserver (%s:%s)\n", node, strings.Join(podIPs, ", "), c.Addresses.ControlPlane.HubIP, port)
	return unblock, nil
}

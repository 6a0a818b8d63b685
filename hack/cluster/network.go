package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
)

// Addresses is where one node cluster lives. Every address is carved from
// 100.64.0.0/10 (shared address space, never routed to the internet and
// never used by this machine): slot i owns 100.(64+i).0.0/16. The node runs
// in its own network namespace, as kind runs a node in a container, because
// a pod's 127.0.0.0/8 is the pod's own loopback: pods can reach neither a
// loopback ClusterIP nor an apiserver bound to the host's 127.0.0.1.
type Addresses struct {
	// NetNS is the name of the node's network namespace (ip netns).
	NetNS string
	// HostVeth/NodeVeth are the two ends of the veth pair between the host
	// and the node namespace; HostIP/NodeIP their addresses in a /30.
	HostVeth, NodeVeth string
	HostIP, NodeIP     net.IP
	// Bridge is the CNI bridge in the node namespace; BridgeIP its address,
	// the pods' gateway.
	Bridge   string
	BridgeIP net.IP
	// Block is the slot's /16: the host routes it through the node.
	Block *net.IPNet
	// PodCIDR holds pod addresses (CNI host-local), ServiceCIDR ClusterIPs.
	PodCIDR, ServiceCIDR *net.IPNet
	// APIServerServiceIP is the `kubernetes` Service's ClusterIP (the
	// first of ServiceCIDR), DNSServiceIP the cluster DNS Service's.
	APIServerServiceIP, DNSServiceIP net.IP
}

// MaxSlots is how many clusters can run on one machine at the same time:
// the number of /16s in 100.64.0.0/10.
const MaxSlots = 64

// PlanAddresses returns the addresses of slot i. Pure: the same slot always
// gives the same plan, which is what lets a later run find and remove what a
// killed run left behind.
func PlanAddresses(slot int) (Addresses, error) {
	if slot < 0 || slot >= MaxSlots {
		return Addresses{}, fmt.Errorf("cluster slot %d outside 0..%d", slot, MaxSlots-1)
	}
	b := byte(64 + slot)
	ip := func(c, d byte) net.IP { return net.IPv4(100, b, c, d).To4() }
	cidr := func(c byte, ones int) *net.IPNet {
		return &net.IPNet{IP: ip(c, 0), Mask: net.CIDRMask(ones, 32)}
	}
	return Addresses{
		NetNS:              fmt.Sprintf("cachetier-node-%d", slot),
		HostVeth:           fmt.Sprintf("ct%d-host", slot),
		NodeVeth:           fmt.Sprintf("ct%d-node", slot),
		HostIP:             ip(255, 1),
		NodeIP:             ip(255, 2),
		Bridge:             fmt.Sprintf("ct%d-br", slot),
		BridgeIP:           ip(1, 1),
		Block:              &net.IPNet{IP: ip(0, 0), Mask: net.CIDRMask(16, 32)},
		PodCIDR:            cidr(1, 24),
		ServiceCIDR:        cidr(128, 24),
		APIServerServiceIP: ip(128, 1),
		DNSServiceIP:       ip(128, 10),
	}, nil
}

// NetNSPath is the namespace's bind mount, what nsenter --net takes.
func (a Addresses) NetNSPath() string { return "/var/run/netns/" + a.NetNS }

// setupNetwork creates the node namespace, the veth pair, the bridge and the
// routes. Forwarding is enabled inside the namespace only: the host
// originates and receives its own traffic and forwards nothing.
func setupNetwork(ctx context.Context, a Addresses) error {
	host := func(args ...string) []string { return args }
	node := func(args ...string) []string {
		return append([]string{"nsenter", "--net=" + a.NetNSPath(), "--"}, args...)
	}
	steps := [][]string{
		host("ip", "netns", "add", a.NetNS),
		host("ip", "link", "add", a.HostVeth, "type", "veth", "peer", "name", a.NodeVeth),
		host("ip", "link", "set", a.NodeVeth, "netns", a.NetNS),
		host("ip", "addr", "add", cidrString(a.HostIP, 30), "dev", a.HostVeth),
		host("ip", "link", "set", a.HostVeth, "up"),
		// The host reaches the node, its pods and its ClusterIPs (through
		// kube-proxy's DNAT in the node namespace) by one route.
		host("ip", "route", "add", a.Block.String(), "via", a.NodeIP.String(), "dev", a.HostVeth),
		node("ip", "link", "set", "lo", "up"),
		node("ip", "addr", "add", cidrString(a.NodeIP, 30), "dev", a.NodeVeth),
		node("ip", "link", "set", a.NodeVeth, "up"),
		// The bridge exists before the first pod (the CNI bridge plugin
		// adopts it) so that the service-range route below has a device:
		// without a route a connect() to a ClusterIP from the node
		// namespace (the aggregator's) fails before kube-proxy's DNAT.
		node("ip", "link", "add", a.Bridge, "type", "bridge"),
		node("ip", "addr", "add", cidrString(a.BridgeIP, 24), "dev", a.Bridge),
		node("ip", "link", "set", a.Bridge, "up"),
		node("ip", "route", "add", a.ServiceCIDR.String(), "dev", a.Bridge),
		// Pods reach ClusterIPs and the host reaches pods by routing
		// through the namespace. No default route: nothing in the node
		// can reach anything but the host end of the veth.
		node("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"),
		// Replies of a pod to a pod that reached it through a ClusterIP
		// cross the bridge; kube-proxy's conntrack must see them.
		node("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"),
	}
	for _, s := range steps {
		if out, err := exec.CommandContext(ctx, s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// teardownNetwork removes the namespace (its interfaces, routes and iptables
// rules go with it) and the host end of the veth with its route. It reports
// what it could not remove; removing what does not exist is not an error, so
// it also cleans up after a run that died half way.
func teardownNetwork(ctx context.Context, a Addresses) error {
	var errs []error
	if linkExists(a.HostVeth) {
		if out, err := exec.CommandContext(ctx, "ip", "link", "del", a.HostVeth).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", a.HostVeth, err, strings.TrimSpace(string(out))))
		}
	}
	if _, err := os.Stat(a.NetNSPath()); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "del", a.NetNS).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", a.NetNS, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func cidrString(ip net.IP, ones int) string { return fmt.Sprintf("%s/%d", ip, ones) }

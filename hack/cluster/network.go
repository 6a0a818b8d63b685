package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
)

// Addresses is where one cluster lives. Every address is carved from
// 100.64.0.0/10 (shared address space, never routed to the internet and
// never used by this machine): slot i owns 100.(64+i).0.0/16.
//
// The control plane and every node run in network namespaces of their own,
// as kind runs each node in a container: a pod's 127.0.0.0/8 is the pod's
// own loopback, so pods can reach neither a loopback ClusterIP nor an
// apiserver bound to the host's 127.0.0.1, and two nodes must not share
// one. The control plane's namespace is also the network between them: the
// nodes hang off one bridge there (the "hub"), one L2 segment as a switch
// would give machines, and the host reaches everything through one veth
// to it. No overlay: each node routes every other node's pod range to that
// node's address on the hub.
//
// Within the slot's /16:
//
//	100.B.0.0/17      pods (ClusterCIDR); node j's pods 100.B.(j+1).0/24
//	100.B.128.0/24    Services (ClusterIPs)
//	100.B.254.0/30    host (.1) <-> control plane (.2)
//	100.B.255.0/24    the hub: control plane .1, node j .(10+j)
type Addresses struct {
	// Slot is the cluster's slot (see slot.go).
	Slot int
	// Block is the slot's /16: the host routes it to the control plane.
	Block *net.IPNet
	// ClusterCIDR holds every node's pod range.
	ClusterCIDR *net.IPNet
	// ServiceCIDR holds ClusterIPs; APIServerServiceIP is the `kubernetes`
	// Service's (the first of the range), DNSServiceIP the cluster DNS's.
	ServiceCIDR                      *net.IPNet
	APIServerServiceIP, DNSServiceIP net.IP
	// ControlPlane is the namespace of etcd, kube-apiserver, the
	// controllers, and the hub.
	ControlPlane ControlPlaneAddresses
	// Nodes are the nodes' addresses, node j at index j.
	Nodes []NodeAddresses
}

// ControlPlaneAddresses is the control plane's namespace.
type ControlPlaneAddresses struct {
	// NetNS is the namespace's name (ip netns).
	NetNS string
	// HostVeth is the host's end of the veth to the namespace (Uplink its
	// other end); HostIP and UplinkIP their addresses in a /30.
	HostVeth, Uplink string
	HostIP, UplinkIP net.IP
	// Hub is the bridge the nodes are plugged into; HubIP the control
	// plane's address on it (the apiserver's advertise address).
	Hub   string
	HubIP net.IP
}

// NodeAddresses is one node's namespace.
type NodeAddresses struct {
	// Name is the Node's name.
	Name string
	// NetNS is the namespace's name (ip netns).
	NetNS string
	// Port is the node's veth end plugged into the hub (in the control
	// plane's namespace); Link its other end, in the node's namespace.
	// Taking Port down is pulling the node's cable.
	Port, Link string
	// IP is the node's address on the hub, its InternalIP.
	IP net.IP
	// Bridge is the CNI bridge in the node's namespace; BridgeIP its
	// address, the pods' gateway.
	Bridge   string
	BridgeIP net.IP
	// PodCIDR holds the node's pod addresses (CNI host-local).
	PodCIDR *net.IPNet
}

// MaxSlots is how many clusters can run on one machine at the same time:
// the number of /16s in 100.64.0.0/10.
const MaxSlots = 64

// MaxNodes is how many nodes one cluster can have: pod ranges
// 100.B.1.0/24 .. 100.B.16.0/24.
const MaxNodes = 16

// NodeNameAt is the name of node j: cachetier-node-0, cachetier-node-1,
// ... Names never need the machine's resolver: the apiserver reaches
// kubelets by their InternalIP.
func NodeNameAt(j int) string { return fmt.Sprintf("cachetier-node-%d", j) }

// NodeName is the first node's name, the only node of a one-node cluster.
const NodeName = "cachetier-node-0"

// controlPlaneNodeName is what the control plane's kube-proxy calls itself;
// no Node of that name exists (no kubelet runs there).
const controlPlaneNodeName = "cachetier-control-plane"

// netnsPrefix starts the name of every namespace of slot's clusters.
func netnsPrefix(slot int) string { return fmt.Sprintf("cachetier-%d-", slot) }

// PlanAddresses returns the addresses of a cluster of nodes nodes in slot
// slot. Pure: the same slot always gives the same plan, which is what lets
// a later run find and remove what a killed run left behind.
func PlanAddresses(slot, nodes int) (Addresses, error) {
	if slot < 0 || slot >= MaxSlots {
		return Addresses{}, fmt.Errorf("cluster slot %d outside 0..%d", slot, MaxSlots-1)
	}
	if nodes < 1 || nodes > MaxNodes {
		return Addresses{}, fmt.Errorf("%d nodes: a cluster has 1 to %d", nodes, MaxNodes)
	}
	b := byte(64 + slot)
	ip := func(c, d byte) net.IP { return net.IPv4(100, b, c, d).To4() }
	cidr := func(c byte, ones int) *net.IPNet {
		return &net.IPNet{IP: ip(c, 0), Mask: net.CIDRMask(ones, 32)}
	}
	a := Addresses{
		Slot:               slot,
		Block:              cidr(0, 16),
		ClusterCIDR:        cidr(0, 17),
		ServiceCIDR:        cidr(128, 24),
		APIServerServiceIP: ip(128, 1),
		DNSServiceIP:       ip(128, 10),
		ControlPlane: ControlPlaneAddresses{
			NetNS:    netnsPrefix(slot) + "cp",
			HostVeth: fmt.Sprintf("ct%d-host", slot),
			Uplink:   "uplink",
			HostIP:   ip(254, 1),
			UplinkIP: ip(254, 2),
			Hub:      "hub",
			HubIP:    ip(255, 1),
		},
	}
	for j := 0; j < nodes; j++ {
		a.Nodes = append(a.Nodes, NodeAddresses{
			Name:     NodeNameAt(j),
			NetNS:    fmt.Sprintf("%snode-%d", netnsPrefix(slot), j),
			Port:     fmt.Sprintf("node%d", j),
			Link:     "eth0",
			IP:       ip(255, byte(10+j)),
			Bridge:   "cbr0",
			BridgeIP: ip(byte(1+j), 1),
			PodCIDR:  cidr(byte(1+j), 24),
		})
	}
	return a, nil
}

// NetNSPath is a namespace's bind mount, what nsenter --net takes.
func NetNSPath(netns string) string { return "/var/run/netns/" + netns }

// NetNSPath is the control plane's namespace.
func (a ControlPlaneAddresses) NetNSPath() string { return NetNSPath(a.NetNS) }

// NetNSPath is the node's namespace.
func (a NodeAddresses) NetNSPath() string { return NetNSPath(a.NetNS) }

// Node returns the addresses of the node called name.
func (a Addresses) Node(name string) (NodeAddresses, bool) {
	for _, n := range a.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return NodeAddresses{}, false
}

// netSteps are the commands that build the cluster's network, in order.
// Pure, so the plan can be read (and tested) without running it.
//
// Forwarding is enabled inside the namespaces only: the host originates and
// receives its own traffic and forwards nothing; the control plane's
// namespace routes between the host and the nodes.
func netSteps(a Addresses) [][]string {
	cp := a.ControlPlane
	host := func(args ...string) []string { return args }
	in := func(ns string, args ...string) []string {
		return append([]string{"nsenter", "--net=" + NetNSPath(ns), "--"}, args...)
	}
	steps := [][]string{
		host("ip", "netns", "add", cp.NetNS),
		host("ip", "link", "add", cp.HostVeth, "type", "veth", "peer", "name", cp.Uplink, "netns", cp.NetNS),
		host("ip", "addr", "add", cidrString(cp.HostIP, 30), "dev", cp.HostVeth),
		host("ip", "link", "set", cp.HostVeth, "up"),
		// The host reaches the control plane, every node, pod and
		// ClusterIP (through the control plane's kube-proxy) by one route.
		host("ip", "route", "add", a.Block.String(), "via", cp.UplinkIP.String(), "dev", cp.HostVeth),
		in(cp.NetNS, "ip", "link", "set", "lo", "up"),
		in(cp.NetNS, "ip", "addr", "add", cidrString(cp.UplinkIP, 30), "dev", cp.Uplink),
		in(cp.NetNS, "ip", "link", "set", cp.Uplink, "up"),
		in(cp.NetNS, "ip", "link", "add", cp.Hub, "type", "bridge"),
		in(cp.NetNS, "ip", "addr", "add", cidrString(cp.HubIP, 24), "dev", cp.Hub),
		in(cp.NetNS, "ip", "link", "set", cp.Hub, "up"),
		// A connect() to a ClusterIP (the aggregator's, to an APIService's
		// Service) needs a route before kube-proxy's DNAT rewrites it.
		in(cp.NetNS, "ip", "route", "add", a.ServiceCIDR.String(), "dev", cp.Hub),
		in(cp.NetNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"),
		// Frames between nodes cross the hub as a switch's would: not
		// through the control plane's iptables (its kube-proxy's rules
		// are for its own traffic).
		in(cp.NetNS, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0"),
	}
	for _, n := range a.Nodes {
		steps = append(steps,
			host("ip", "netns", "add", n.NetNS),
			in(cp.NetNS, "ip", "link", "add", n.Port, "type", "veth", "peer", "name", n.Link, "netns", n.NetNS),
			in(cp.NetNS, "ip", "link", "set", n.Port, "master", cp.Hub),
			in(cp.NetNS, "ip", "link", "set", n.Port, "up"),
			in(cp.NetNS, "ip", "route", "add", n.PodCIDR.String(), "via", n.IP.String(), "dev", cp.Hub),
			in(n.NetNS, "ip", "link", "set", "lo", "up"),
			in(n.NetNS, "ip", "addr", "add", cidrString(n.IP, 24), "dev", n.Link),
			in(n.NetNS, "ip", "link", "set", n.Link, "up"),
			// The bridge exists before the first pod (the CNI bridge
			// plugin adopts it) so that the service-range route below
			// has a device.
			in(n.NetNS, "ip", "link", "add", n.Bridge, "type", "bridge"),
			in(n.NetNS, "ip", "addr", "add", cidrString(n.BridgeIP, 24), "dev", n.Bridge),
			in(n.NetNS, "ip", "link", "set", n.Bridge, "up"),
			in(n.NetNS, "ip", "route", "add", a.ServiceCIDR.String(), "dev", n.Bridge),
			// The host's uplink through the control plane. No default
			// route: nothing in a node can reach anything outside the
			// cluster.
			in(n.NetNS, "ip", "route", "add", network(cp.HostIP, 30).String(), "via", cp.HubIP.String(), "dev", n.Link),
			in(n.NetNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"),
			// Replies of a pod to a pod that reached it through a
			// ClusterIP cross the bridge; kube-proxy's conntrack must see
			// them.
			in(n.NetNS, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"),
		)
		// Every other node's pods, straight to that node over the hub.
		for _, o := range a.Nodes {
			if o.Name != n.Name {
				steps = append(steps, in(n.NetNS, "ip", "route", "add", o.PodCIDR.String(), "via", o.IP.String(), "dev", n.Link))
			}
		}
	}
	return steps
}

// setupNetwork runs netSteps.
func setupNetwork(ctx context.Context, a Addresses) error {
	for _, s := range netSteps(a) {
		if err := run(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

func run(ctx context.Context, args ...string) error {
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setNodeLink plugs the node's cable in or pulls it out: its port on the
// hub up or down. Down, the node is silent as a machine that died is: its
// neighbours' ARP for it goes unanswered and packets to it are lost.
func setNodeLink(ctx context.Context, a Addresses, n NodeAddresses, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return run(ctx, "nsenter", "--net="+a.ControlPlane.NetNSPath(), "--", "ip", "link", "set", n.Port, state)
}

// teardownNetwork removes every namespace of the slot (their interfaces,
// routes and iptables rules go with them; a run that died may have had
// another number of nodes, so they are found by name) and the host's end
// of the uplink with its route. It reports what it could not remove;
// removing what does not exist is not an error, so it also cleans up after
// a run that died half way.
func teardownNetwork(ctx context.Context, a Addresses) error {
	var errs []error
	if linkExists(a.ControlPlane.HostVeth) {
		if err := run(ctx, "ip", "link", "del", a.ControlPlane.HostVeth); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ns := range slotNamespaces(a.Slot) {
		if err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// slotNamespaces lists the network namespaces that exist for slot, nodes
// before the control plane (whose hub their links hang off).
func slotNamespaces(slot int) []string {
	entries, _ := os.ReadDir("/var/run/netns")
	var out []string
	for _, e := range entries {
		if s, ok := netnsSlot(e.Name()); ok && s == slot {
			out = append(out, e.Name())
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if cpi, cpj := strings.HasSuffix(out[i], "-cp"), strings.HasSuffix(out[j], "-cp"); cpi != cpj {
			return cpj
		}
		return out[i] < out[j]
	})
	return out
}

// netnsSlot is the slot a namespace of a cluster belongs to:
// cachetier-<slot>-cp, cachetier-<slot>-node-<j>, and the one-node
// clusters' cachetier-node-<slot> of earlier versions.
func netnsSlot(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "cachetier-")
	if !ok {
		return 0, false
	}
	if legacy, ok := strings.CutPrefix(rest, "node-"); ok {
		s, err := strconv.Atoi(legacy)
		return s, err == nil
	}
	num, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	s, err := strconv.Atoi(num)
	return s, err == nil
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func cidrString(ip net.IP, ones int) string { return fmt.Sprintf("%s/%d", ip, ones) }

// network is the prefix of length ones that holds ip.
func network(ip net.IP, ones int) *net.IPNet {
	mask := net.CIDRMask(ones, 32)
	return &net.IPNet{IP: ip.Mask(mask), Mask: mask}
}

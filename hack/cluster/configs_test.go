package cluster

import (
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"

	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// forbidden are the ranges the network rule keeps this project away from.
var forbidden = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}

func TestPlanAddressesStaysInSharedSpaceAndApart(t *testing.T) {
	_, shared, _ := net.ParseCIDR("100.64.0.0/10")
	seenBlock := map[string]int{}
	seenHostLink := map[string]int{}
	for slot := 0; slot < MaxSlots; slot++ {
		a, err := PlanAddresses(slot, MaxNodes)
		if err != nil {
			t.Fatal(err)
		}
		cp := a.ControlPlane
		ips := []net.IP{cp.HostIP, cp.UplinkIP, cp.HubIP, a.APIServerServiceIP, a.DNSServiceIP, a.ServiceCIDR.IP, a.ClusterCIDR.IP}
		ranges := []*net.IPNet{a.ServiceCIDR, network(cp.HostIP, 30), network(cp.HubIP, 24)}
		names := map[string]bool{cp.Uplink: true, cp.Hub: true}
		netns := map[string]bool{cp.NetNS: true}
		for _, n := range a.Nodes {
			ips = append(ips, n.IP, n.BridgeIP, n.PodCIDR.IP)
			if !a.ClusterCIDR.Contains(n.PodCIDR.IP) || !n.PodCIDR.Contains(n.BridgeIP) {
				t.Errorf("slot %d: %s's pods %s (gateway %s) outside the cluster's %s", slot, n.Name, n.PodCIDR, n.BridgeIP, a.ClusterCIDR)
			}
			if !ranges[2].Contains(n.IP) {
				t.Errorf("slot %d: %s's address %s is not on the hub %s", slot, n.Name, n.IP, ranges[2])
			}
			for _, r := range ranges {
				if r.Contains(n.PodCIDR.IP) || n.PodCIDR.Contains(r.IP) {
					t.Errorf("slot %d: %s's pods %s overlap %s", slot, n.Name, n.PodCIDR, r)
				}
			}
			ranges = append(ranges, n.PodCIDR)
			if names[n.Port] || netns[n.NetNS] {
				t.Errorf("slot %d: %s's port %s or namespace %s is taken", slot, n.Name, n.Port, n.NetNS)
			}
			names[n.Port], netns[n.NetNS] = true, true
			if s, ok := netnsSlot(n.NetNS); !ok || s != slot {
				t.Errorf("namespace %s does not name its slot %d", n.NetNS, slot)
			}
			for _, name := range []string{n.Port, n.Link, n.Bridge} {
				if len(name) > 15 { // IFNAMSIZ - 1
					t.Errorf("slot %d: interface name %q longer than 15 bytes", slot, name)
				}
			}
		}
		for _, ip := range ips {
			if !shared.Contains(ip) || !a.Block.Contains(ip) {
				t.Errorf("slot %d: %s outside 100.64.0.0/10 or its block %s", slot, ip, a.Block)
			}
			for _, f := range forbidden {
				_, n, _ := net.ParseCIDR(f)
				if n.Contains(ip) {
					t.Errorf("slot %d: %s in forbidden %s", slot, ip, f)
				}
			}
		}
		if a.ClusterCIDR.Contains(a.ServiceCIDR.IP) || a.ServiceCIDR.Contains(a.ClusterCIDR.IP) || a.ClusterCIDR.Contains(cp.HubIP) {
			t.Errorf("slot %d: pods %s, services %s and the hub overlap", slot, a.ClusterCIDR, a.ServiceCIDR)
		}
		if !a.ServiceCIDR.Contains(a.APIServerServiceIP) || !a.ServiceCIDR.Contains(a.DNSServiceIP) {
			t.Errorf("slot %d: service IPs outside their range", slot)
		}
		if s, ok := netnsSlot(cp.NetNS); !ok || s != slot {
			t.Errorf("namespace %s does not name its slot %d", cp.NetNS, slot)
		}
		// The host sees only its end of the uplink: that name must be
		// the slot's own.
		if len(cp.HostVeth) > 15 {
			t.Errorf("slot %d: interface name %q longer than 15 bytes", slot, cp.HostVeth)
		}
		if prev, ok := seenHostLink[cp.HostVeth]; ok {
			t.Errorf("interface %q used by slots %d and %d", cp.HostVeth, prev, slot)
		}
		seenHostLink[cp.HostVeth] = slot
		if prev, ok := seenBlock[a.Block.String()]; ok {
			t.Errorf("block %s used by slots %d and %d", a.Block, prev, slot)
		}
		seenBlock[a.Block.String()] = slot
	}
	for _, bad := range [][2]int{{-1, 1}, {MaxSlots, 1}, {0, 0}, {0, MaxNodes + 1}} {
		if _, err := PlanAddresses(bad[0], bad[1]); err == nil {
			t.Errorf("slot %d with %d nodes accepted", bad[0], bad[1])
		}
	}
	// A namespace of another program is never taken for one of ours.
	for _, name := range []string{"cachetier", "cachetier-x-cp", "other-3-cp", "cachetier-node-x"} {
		if s, ok := netnsSlot(name); ok {
			t.Errorf("netnsSlot(%q) = %d, want none", name, s)
		}
	}
	if s, ok := netnsSlot("cachetier-node-7"); !ok || s != 7 {
		t.Errorf("an earlier version's namespace cachetier-node-7 is not slot 7's")
	}
}

// TestNetStepsRouteEveryNodeToEveryOther: every node routes each other
// node's pods to that node, the control plane routes each node's pods to
// it, and nothing is routed anywhere outside the slot's block.
func TestNetStepsRouteEveryNodeToEveryOther(t *testing.T) {
	a, _ := PlanAddresses(5, 3)
	steps := netSteps(a)
	has := func(ns string, words ...string) bool {
		for _, s := range steps {
			if (ns == "" && s[0] == "ip") || (len(s) > 1 && s[1] == "--net="+NetNSPath(ns)) {
				if strings.Contains(strings.Join(s, " "), strings.Join(words, " ")) {
					return true
				}
			}
		}
		return false
	}
	for _, n := range a.Nodes {
		if !has(a.ControlPlane.NetNS, "route add", n.PodCIDR.String(), "via", n.IP.String()) {
			t.Errorf("the control plane does not route %s's pods", n.Name)
		}
		for _, o := range a.Nodes {
			if o.Name != n.Name && !has(n.NetNS, "route add", o.PodCIDR.String(), "via", o.IP.String()) {
				t.Errorf("%s does not route %s's pods %s", n.Name, o.Name, o.PodCIDR)
			}
		}
	}
	for _, s := range steps {
		joined := strings.Join(s, " ")
		if !strings.Contains(joined, "route add") {
			continue
		}
		if strings.Contains(joined, "default") || strings.Contains(joined, "0.0.0.0/0") {
			t.Errorf("a default route: %s", joined)
		}
		// A route's destination is a network, not an address in one
		// (ip refuses "invalid prefix for given prefix length").
		for _, arg := range s {
			if ip, n, err := net.ParseCIDR(arg); err == nil && !ip.Equal(n.IP) {
				t.Errorf("route to %s, not to its network %s: %s", arg, n, joined)
			}
		}
	}
	if !has("", "route add", a.Block.String(), "via", a.ControlPlane.UplinkIP.String()) {
		t.Error("the host does not route the slot's block to the control plane")
	}
}

// TestRenderedConfigsDecodeStrictly: the kubelet and kube-proxy configs
// decode into their own types with unknown fields refused, and say what the
// node depends on.
func TestRenderedConfigsDecodeStrictly(t *testing.T) {
	a, _ := PlanAddresses(3, 2)
	n := a.Nodes[1]
	l := Layout{Dir: "/tmp/cachetier-cluster-x/" + n.Name}
	kc, err := RenderKubeletConfig(l, n, a.DNSServiceIP, KubeletFiles{ClientCAFile: "/ca.crt", TLSCertFile: "/k.crt", TLSKeyFile: "/k.key"})
	if err != nil {
		t.Fatal(err)
	}
	var k kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict([]byte(kc), &k); err != nil {
		t.Fatalf("kubelet config: %v\n%s", err, kc)
	}
	if k.Kind != "KubeletConfiguration" || k.CgroupDriver != "cgroupfs" || *k.CgroupsPerQOS || *k.FailCgroupV1 ||
		len(k.EnforceNodeAllocatable) != 1 || k.EnforceNodeAllocatable[0] != "none" ||
		k.ContainerRuntimeEndpoint != "unix://"+l.ContainerdSocket() || k.ClusterDNS[0] != a.DNSServiceIP.String() ||
		!strings.HasPrefix(*k.ResolverConfig, l.Dir) || !strings.HasPrefix(k.PodLogsDir, l.Dir) || *k.Authentication.Anonymous.Enabled ||
		k.Address != n.IP.String() {
		t.Errorf("kubelet config does not say what the node needs:\n%s", kc)
	}
	pc, err := RenderKubeProxyConfig(a.ClusterCIDR, n.Name, n.IP, "/kp.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	var p kubeproxyv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict([]byte(pc), &p); err != nil {
		t.Fatalf("kube-proxy config: %v\n%s", err, pc)
	}
	if p.Mode != "iptables" || p.ClusterCIDR != a.ClusterCIDR.String() || p.HostnameOverride != n.Name || p.BindAddress != n.IP.String() || *p.Conntrack.MaxPerCore != 0 {
		t.Errorf("kube-proxy config does not say what the node needs:\n%s", pc)
	}

	var cni struct {
		Plugins []struct {
			Type   string `json:"type"`
			Bridge string `json:"bridge"`
			IPAM   struct {
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(RenderCNIConfig(l, n)), &cni); err != nil {
		t.Fatal(err)
	}
	if cni.Plugins[0].Type != "bridge" || cni.Plugins[0].Bridge != n.Bridge || cni.Plugins[0].IPAM.Ranges[0][0]["subnet"] != n.PodCIDR.String() ||
		!strings.HasPrefix(cni.Plugins[0].IPAM.DataDir, l.Dir) {
		t.Errorf("CNI config: %+v", cni)
	}

	cc := RenderContainerdConfig(l, "localhost/pause:1")
	for _, want := range []string{
		`sandbox_image = "localhost/pause:1"`, "restrict_oom_score_adj = true", "netns_mounts_under_state_dir = true",
		`address = "` + l.ContainerdSocket() + `"`, `root = "` + l.ContainerdRoot() + `"`, `Root = "` + l.RuncRoot() + `"`,
	} {
		if !strings.Contains(cc, want) {
			t.Errorf("containerd config lacks %q:\n%s", want, cc)
		}
	}
}

// TestCheckPrerequisitesNamesWhatIsMissing: with nothing on PATH and an
// empty binary directory, the error lists every missing piece with the
// package or make target that provides it.
func TestCheckPrerequisitesNamesWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := CheckPrerequisites(t.TempDir())
	if err == nil {
		t.Fatal("no error with nothing installed")
	}
	for _, want := range []string{"kubelet (run `make controlplane`)", "containerd (Debian package containerd)", "runc (Debian package runc)",
		"iptables (Debian package iptables)", "nsenter (Debian package util-linux)", "make node-deps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if os.Geteuid() != 0 && !strings.Contains(err.Error(), "root") {
		t.Errorf("error does not say root is needed: %v", err)
	}
}

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
	seen := map[string]int{}
	for slot := 0; slot < MaxSlots; slot++ {
		a, err := PlanAddresses(slot)
		if err != nil {
			t.Fatal(err)
		}
		ips := []net.IP{a.HostIP, a.NodeIP, a.BridgeIP, a.APIServerServiceIP, a.DNSServiceIP, a.PodCIDR.IP, a.ServiceCIDR.IP}
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
		if a.PodCIDR.Contains(a.ServiceCIDR.IP) || a.ServiceCIDR.Contains(a.PodCIDR.IP) || a.PodCIDR.Contains(a.NodeIP) || a.ServiceCIDR.Contains(a.NodeIP) {
			t.Errorf("slot %d: pod %s, service %s and node %s overlap", slot, a.PodCIDR, a.ServiceCIDR, a.NodeIP)
		}
		if !a.ServiceCIDR.Contains(a.APIServerServiceIP) || !a.ServiceCIDR.Contains(a.DNSServiceIP) || !a.PodCIDR.Contains(a.BridgeIP) {
			t.Errorf("slot %d: service IPs or gateway outside their ranges", slot)
		}
		for _, name := range []string{a.HostVeth, a.NodeVeth, a.Bridge} {
			if len(name) > 15 { // IFNAMSIZ - 1
				t.Errorf("slot %d: interface name %q longer than 15 bytes", slot, name)
			}
			if prev, ok := seen[name]; ok {
				t.Errorf("interface %q used by slots %d and %d", name, prev, slot)
			}
			seen[name] = slot
		}
		if prev, ok := seen[a.Block.String()]; ok {
			t.Errorf("block %s used by slots %d and %d", a.Block, prev, slot)
		}
		seen[a.Block.String()] = slot
	}
	for _, bad := range []int{-1, MaxSlots} {
		if _, err := PlanAddresses(bad); err == nil {
			t.Errorf("slot %d accepted", bad)
		}
	}
}

// TestRenderedConfigsDecodeStrictly: the kubelet and kube-proxy configs
// decode into their own types with unknown fields refused, and say what the
// node depends on.
func TestRenderedConfigsDecodeStrictly(t *testing.T) {
	a, _ := PlanAddresses(3)
	l := Layout{Dir: "/tmp/cachetier-node-x"}
	kc, err := RenderKubeletConfig(l, a, KubeletFiles{ClientCAFile: "/ca.crt", TLSCertFile: "/k.crt", TLSKeyFile: "/k.key"})
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
		!strings.HasPrefix(*k.ResolverConfig, l.Dir) || !strings.HasPrefix(k.PodLogsDir, l.Dir) || *k.Authentication.Anonymous.Enabled {
		t.Errorf("kubelet config does not say what the node needs:\n%s", kc)
	}
	pc, err := RenderKubeProxyConfig(a, "/kp.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	var p kubeproxyv1alpha1.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict([]byte(pc), &p); err != nil {
		t.Fatalf("kube-proxy config: %v\n%s", err, pc)
	}
	if p.Mode != "iptables" || p.ClusterCIDR != a.PodCIDR.String() || p.HostnameOverride != NodeName || *p.Conntrack.MaxPerCore != 0 {
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
	if err := json.Unmarshal([]byte(RenderCNIConfig(l, a)), &cni); err != nil {
		t.Fatal(err)
	}
	if cni.Plugins[0].Type != "bridge" || cni.Plugins[0].Bridge != a.Bridge || cni.Plugins[0].IPAM.Ranges[0][0]["subnet"] != a.PodCIDR.String() ||
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

package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbasev1alpha1 "k8s.io/component-base/config/v1alpha1"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// The node's configuration files are rendered by pure functions from the
// cluster's layout, so what each component is told can be unit tested and
// read in one place.

// Layout is where a node keeps its state: everything under one directory
// (of the cluster's), so that teardown can prove nothing was left behind by
// looking there. Stopping a node as a machine dies keeps what a machine's
// disk would keep (containerd's root, the kubelet's root, CNI's address
// records) and loses the rest: ContainerdState is the node's /run.
type Layout struct {
	Dir string
}

func (l Layout) path(parts ...string) string {
	return filepath.Join(append([]string{l.Dir}, parts...)...)
}

// ContainerdConfig, ContainerdRoot, ... name the node's files.
func (l Layout) ContainerdConfig() string { return l.path("containerd", "config.toml") }
func (l Layout) ContainerdRoot() string   { return l.path("containerd", "root") }
func (l Layout) ContainerdState() string  { return l.path("containerd", "state") }
func (l Layout) ContainerdSocket() string { return l.path("containerd", "containerd.sock") }
func (l Layout) RuncRoot() string         { return l.path("containerd", "runc") }
func (l Layout) RegistryConfig() string   { return l.path("containerd", "certs.d") }
func (l Layout) CNIConfDir() string       { return l.path("cni", "net.d") }
func (l Layout) CNIIPAMDir() string       { return l.path("cni", "ipam") }
func (l Layout) KubeletRoot() string      { return l.path("kubelet") }
func (l Layout) KubeletConfig() string    { return l.path("kubelet-config.yaml") }
func (l Layout) PodLogs() string          { return l.path("pod-logs") }
func (l Layout) ResolvConf() string       { return l.path("resolv.conf") }
func (l Layout) KubeProxyConfig() string  { return l.path("kube-proxy-config.yaml") }

// CNIBinDir is where Debian's containernetworking-plugins puts the plugins.
const CNIBinDir = "/usr/lib/cni"

// RenderContainerdConfig returns containerd's config.toml. Everything
// containerd writes lives under the layout: root, state, sockets, runc's
// state and — netns_mounts_under_state_dir — the pods' network namespace
// mounts, which would otherwise land in the host's /var/run/netns.
func RenderContainerdConfig(l Layout, sandboxImage string) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return fmt.Sprintf(`version = 2
root = %s
state = %s
# Snapshotters this machine cannot use only log errors at start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = %s

[ttrpc]
  address = %s

[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.grpc.v1.cri"]
  # Nothing can be pulled here: the sandbox image must be imported first.
  sandbox_image = %s
  # The sandbox these machines run in lacks CAP_SYS_RESOURCE: lowering a
  # container's oom_score_adj (the pause container asks for -998) is refused
  # and runc fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroup v1 with the cgroupfs driver, as the kubelet is told.
        SystemdCgroup = false
        Root = %s

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %s
    conf_dir = %s
    max_conf_num = 1

  # Every registry is the one in RenderRegistryHosts: none.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %s
`, q(l.ContainerdRoot()), q(l.ContainerdState()), q(l.ContainerdSocket()), q(l.ContainerdSocket()+".ttrpc"),
		q(l.path("containerd", "opt")), q(sandboxImage), q(l.RuncRoot()), q(CNIBinDir), q(l.CNIConfDir()), q(l.RegistryConfig()))
}

// RegistryHostsFile is where containerd looks for the hosts of any registry
// without a directory of its own.
func (l Layout) RegistryHostsFile() string {
	return filepath.Join(l.RegistryConfig(), "_default", "hosts.toml")
}

// RenderRegistryHosts sends every pull to a closed port of the node's own
// loopback. This node has no registry (images are imported), and a pull
// must not look a registry's name up with the machine's resolver, which
// containerd would otherwise read from the host's /etc/resolv.conf: a pod
// whose image is missing fails at once with "connection refused" on
// 127.0.0.1, and nothing leaves the node.
func RenderRegistryHosts() string {
	return `# No registry: images are imported with ctr images import.
server = "http://127.0.0.1:1"
`
}

// RenderCNIConfig returns the pod network: the bridge plugin on the node's
// bridge (set up before containerd starts) with host-local addresses from
// the pod range, kept under the layout rather than /var/lib/cni so that two
// clusters on one machine never share address state. hairpinMode lets a pod
// reach itself through its own Service.
func RenderCNIConfig(l Layout, a NodeAddresses) string {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "cachetier-pods",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      a.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": l.CNIIPAMDir(),
					"ranges":  [][]map[string]string{{{"subnet": a.PodCIDR.String(), "gateway": a.BridgeIP.String()}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return string(b) + "\n"
}

// KubeletFiles are the credentials the kubelet config refers to.
type KubeletFiles struct {
	ClientCAFile, TLSCertFile, TLSKeyFile string
}

// RenderKubeletConfig returns the KubeletConfiguration, rendered from the
// kubelet's own API types so a misspelt field cannot slip through. The
// choices follow what this machine allows (BRIEF, "a real node"): cgroup v1
// with the cgroupfs driver and no QoS cgroup hierarchy, no node-allocatable
// enforcement, swap tolerated. Everything the kubelet writes lives under the
// layout. Eviction and image GC thresholds are set so that a nearly full
// disk on a shared machine neither evicts the pods nor deletes the imported
// images, which could not be pulled again.
func RenderKubeletConfig(l Layout, a NodeAddresses, dns net.IP, f KubeletFiles) (string, error) {
	cfg := kubeletv1beta1.KubeletConfiguration{
		TypeMeta:                 metav1.TypeMeta{APIVersion: kubeletv1beta1.SchemeGroupVersion.String(), Kind: "KubeletConfiguration"},
		FailCgroupV1:             ptr.To(false),
		CgroupDriver:             "cgroupfs",
		CgroupsPerQOS:            ptr.To(false),
		EnforceNodeAllocatable:   []string{"none"}, // an empty list would be defaulted to [pods]
		FailSwapOn:               ptr.To(false),
		ContainerRuntimeEndpoint: "unix://" + l.ContainerdSocket(),
		Address:                  a.IP.String(),
		Port:                     10250,
		ReadOnlyPort:             0,
		HealthzBindAddress:       "127.0.0.1",
		HealthzPort:              ptr.To[int32](10248),
		Authentication: kubeletv1beta1.KubeletAuthentication{
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: f.ClientCAFile},
		},
		Authorization:               kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		TLSCertFile:                 f.TLSCertFile,
		TLSPrivateKeyFile:           f.TLSKeyFile,
		ClusterDomain:               "cluster.local",
		ClusterDNS:                  []string{dns.String()},
		ResolverConfig:              ptr.To(l.ResolvConf()),
		PodLogsDir:                  l.PodLogs(),
		SerializeImagePulls:         ptr.To(false),
		ImageGCHighThresholdPercent: ptr.To[int32](100),
		EvictionHard: map[string]string{
			"memory.available":  "100Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
	}
	b, err := yaml.Marshal(cfg)
	return string(b), err
}

// RenderResolvConf is the node's resolv.conf as pods with dnsPolicy Default
// (CoreDNS itself) see it: only the cluster DNS. The machine's own resolver
// is never handed to a pod.
func RenderResolvConf(dns net.IP) string {
	return "nameserver " + dns.String() + "\n"
}

// RenderKubeProxyConfig returns the KubeProxyConfiguration of the
// kube-proxy called nodeName, bound to its namespace's address bind:
// iptables mode; every pod of the cluster (clusterCIDR) is local traffic,
// the rest is masqueraded on its way to a ClusterIP; conntrack sysctls left
// as they are (zero values), since the namespace's are not kube-proxy's to
// tune; no localhost NodePorts (they need route_localnet).
func RenderKubeProxyConfig(clusterCIDR *net.IPNet, nodeName string, bind net.IP, kubeconfig string) (string, error) {
	cfg := kubeproxyv1alpha1.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kubeproxyv1alpha1.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		ClientConnection:   componentbasev1alpha1.ClientConnectionConfiguration{Kubeconfig: kubeconfig},
		Mode:               "iptables",
		ClusterCIDR:        clusterCIDR.String(),
		HostnameOverride:   nodeName,
		BindAddress:        bind.String(),
		HealthzBindAddress: "127.0.0.1:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		IPTables:           kubeproxyv1alpha1.KubeProxyIPTablesConfiguration{LocalhostNodePorts: ptr.To(false)},
		Conntrack: kubeproxyv1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr.To[int32](0),
			Min:                   ptr.To[int32](0),
			TCPEstablishedTimeout: &metav1.Duration{},
			TCPCloseWaitTimeout:   &metav1.Duration{},
		},
	}
	b, err := yaml.Marshal(cfg)
	return string(b), err
}

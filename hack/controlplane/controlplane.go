// Package controlplane starts a real etcd and kube-apiserver on loopback for
// tests and for `make run`. It is the one place that knows the flags a local
// apiserver needs for cachetier: RBAC, service-account keys, a service
// ClusterIP range inside 127.0.0.0/8 (so the aggregator can dial an
// APIService's ClusterIP on this machine), and the front-proxy
// (request-header) settings of the aggregation layer.
package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cachetier/cachetier/hack/freeport"
	"github.com/cachetier/cachetier/internal/pki"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// DefaultKubernetesVersion is the version hack/build-controlplane.sh
	// builds by default; the binaries live in bin/k8s/<version>-<os>-<arch>.
	DefaultKubernetesVersion = "v1.37.1"
	// DefaultServiceClusterIPRange is inside loopback so that a Service's
	// ClusterIP is an address this machine can listen on.
	DefaultServiceClusterIPRange = "127.0.100.0/24"
	// FrontProxyClientName is the CN of the aggregator's client certificate
	// and the only name in --requestheader-allowed-names.
	FrontProxyClientName = "front-proxy-client"
)

// Options configure a control plane. The zero value is usable.
type Options struct {
	// BinDir holds kube-apiserver, etcd and kubectl. Default: $KUBEBUILDER_ASSETS,
	// else bin/k8s/<DefaultKubernetesVersion>-<os>-<arch> under the repository root.
	BinDir string
	// Dir is the working directory (certificates, etcd data, logs,
	// kubeconfigs). Default: a new temporary directory removed by Stop.
	Dir string
	// ServiceClusterIPRange defaults to DefaultServiceClusterIPRange.
	ServiceClusterIPRange string
	// SecurePort of the apiserver; 0 picks a free port.
	SecurePort int
	// ExtraAPIServerFlags are appended to the apiserver's command line.
	ExtraAPIServerFlags []string
	// AuditPolicy, when set, is an audit.k8s.io/v1 Policy (YAML): the
	// apiserver writes the events it selects to ControlPlane.AuditLog
	// (see audit.go), so a test can count who sent which request.
	AuditPolicy string
	// NetNS, when set (a path such as /var/run/netns/<name>), runs etcd,
	// kube-apiserver and every StartProcess child inside that network
	// namespace (through nsenter, which only switches the network
	// namespace: mounts and cgroups stay the host's).
	NetNS string
	// AdvertiseAddress is the apiserver's address. Default 127.0.0.1; any
	// other address makes the apiserver listen on all addresses of its
	// namespace, port 6443 unless SecurePort says otherwise.
	AdvertiseAddress net.IP
	// ForNode configures the apiserver for a kubelet and the controllers
	// of a real cluster: the Node authorizer and NodeRestriction, the
	// ServiceAccount admission plugin (kube-controller-manager creates the
	// accounts it needs), endpoint reconciliation by lease, and a client
	// certificate for calls to kubelets by their InternalIP.
	ForNode bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// ControlPlane is a running etcd + kube-apiserver pair.
type ControlPlane struct {
	Dir                   string
	BinDir                string
	URL                   string // https://127.0.0.1:<port>
	AdminKubeconfig       string
	ServiceClusterIPRange string
	ClusterCA             *pki.CA // signs the apiserver's serving cert and client certs
	FrontProxyCA          *pki.CA // the request-header CA of the aggregation layer

	// EtcdURL is etcd's client URL, for tests that must change storage
	// behind the apiserver's back (see RestartAPIServer).
	EtcdURL string
	// PKI names the files the control plane's certificates and keys were
	// written to, for components that need them (kube-controller-manager).
	PKI PKIFiles
	// AuditLog is the apiserver's audit log (JSON lines) when
	// Options.AuditPolicy was set; ReadAudit parses it.
	AuditLog string

	removeDir     bool
	netns         string
	log           io.Writer
	apiserverArgs []string
	// mu guards procs: a node's processes come and go (a node stopped and
	// started again) while waits elsewhere ask Exited.
	mu       sync.Mutex
	procs    []*process // in start order; stopped in reverse
	stopOnce sync.Once
	stopErr  error
}

type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done is closed
	log  string
}

// Start launches etcd and kube-apiserver and waits until the apiserver's
// /readyz passes and the default namespace exists. On error everything
// started so far is stopped again.
func Start(ctx context.Context, opts Options) (cp *ControlPlane, err error) {
	if opts.BinDir == "" {
		if opts.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			return nil, fmt.Errorf("control plane binary %s missing in %s (run `make controlplane`): %w", b, opts.BinDir, err)
		}
	}
	cp = &ControlPlane{BinDir: opts.BinDir, Dir: opts.Dir, ServiceClusterIPRange: opts.ServiceClusterIPRange, netns: opts.NetNS, log: opts.Log}
	if cp.log == nil {
		cp.log = io.Discard
	}
	if cp.ServiceClusterIPRange == "" {
		cp.ServiceClusterIPRange = DefaultServiceClusterIPRange
	}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "cachetier-controlplane-"); err != nil {
			return nil, err
		}
		cp.removeDir = true
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
			cp = nil
		}
	}()

	advertise := opts.AdvertiseAddress
	if advertise == nil {
		advertise = net.IPv4(127, 0, 0, 1)
	}
	port := opts.SecurePort
	if port == 0 {
		if port, err = cp.freePort(6443); err != nil {
			return cp, err
		}
	}
	cp.URL = "https://" + net.JoinHostPort(advertise.String(), strconv.Itoa(port))

	if cp.PKI, err = cp.writePKI(advertise); err != nil {
		return cp, fmt.Errorf("generate PKI: %w", err)
	}
	etcdURL, err := cp.startEtcd()
	if err != nil {
		return cp, err
	}
	cp.EtcdURL = etcdURL
	if err := cp.startAPIServer(port, advertise, etcdURL, opts); err != nil {
		return cp, err
	}
	if cp.AdminKubeconfig, err = cp.UserKubeconfig("admin", "system:masters"); err != nil {
		return cp, err
	}
	if err := cp.waitReady(ctx); err != nil {
		return cp, err
	}
	fmt.Fprintf(cp.log, "control plane ready at %s (dir %s)\n", cp.URL, cp.Dir)
	return cp, nil
}

// PKIFiles are the control plane's certificate and key files.
type PKIFiles struct {
	Dir                                 string
	ClusterCA, ClusterCAKey             string
	ServingCert, ServingKey             string
	ServiceAccountKey                   string
	FrontProxyCA                        string
	ProxyClientCert, ProxyClientKey     string
	KubeletClientCert, KubeletClientKey string
}

func (cp *ControlPlane) writePKI(advertise net.IP) (PKIFiles, error) {
	pkiDir := filepath.Join(cp.Dir, "pki")
	f := PKIFiles{Dir: pkiDir}
	if err := os.MkdirAll(pkiDir, 0o700); err != nil {
		return f, err
	}
	var err error
	if cp.ClusterCA, err = pki.NewCA("cachetier-local-cluster-ca"); err != nil {
		return f, err
	}
	if cp.FrontProxyCA, err = pki.NewCA("cachetier-local-front-proxy-ca"); err != nil {
		return f, err
	}
	f.ClusterCA = filepath.Join(pkiDir, "ca.crt")
	f.FrontProxyCA = filepath.Join(pkiDir, "front-proxy-ca.crt")
	if err := os.WriteFile(f.ClusterCA, cp.ClusterCA.CertPEM, 0o600); err != nil {
		return f, err
	}
	caKey, err := cp.ClusterCA.KeyPEM()
	if err != nil {
		return f, err
	}
	// kube-controller-manager signs CertificateSigningRequests with it.
	f.ClusterCAKey = filepath.Join(pkiDir, "ca.key")
	if err := os.WriteFile(f.ClusterCAKey, caKey, 0o600); err != nil {
		return f, err
	}
	if err := os.WriteFile(f.FrontProxyCA, cp.FrontProxyCA.CertPEM, 0o600); err != nil {
		return f, err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), firstServiceIP(cp.ServiceClusterIPRange)}
	if !advertise.IsLoopback() {
		ips = append(ips, advertise)
	}
	serving, err := cp.ClusterCA.IssueServing("kube-apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		ips)
	if err != nil {
		return f, err
	}
	if f.ServingCert, f.ServingKey, err = serving.WriteFiles(filepath.Join(pkiDir, "apiserver")); err != nil {
		return f, err
	}
	proxy, err := cp.FrontProxyCA.IssueClient(FrontProxyClientName, nil)
	if err != nil {
		return f, err
	}
	if f.ProxyClientCert, f.ProxyClientKey, err = proxy.WriteFiles(filepath.Join(pkiDir, "front-proxy-client")); err != nil {
		return f, err
	}
	// The apiserver's identity towards kubelets (logs, exec, port-forward);
	// kubelets authorize it by SubjectAccessReview like any other caller.
	kubeletClient, err := cp.ClusterCA.IssueClient("kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return f, err
	}
	if f.KubeletClientCert, f.KubeletClientKey, err = kubeletClient.WriteFiles(filepath.Join(pkiDir, "apiserver-kubelet-client")); err != nil {
		return f, err
	}
	saKey, err := pki.NewServiceAccountKey()
	if err != nil {
		return f, err
	}
	f.ServiceAccountKey = filepath.Join(pkiDir, "sa.key")
	return f, os.WriteFile(f.ServiceAccountKey, saKey, 0o600)
}

func (cp *ControlPlane) startEtcd() (string, error) {
	clientPort, err := cp.freePort(2379)
	if err != nil {
		return "", err
	}
	peerPort, err := cp.freePort(2380)
	if err != nil {
		return "", err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	_, err = cp.spawn("etcd",
		"--name=default",
		"--data-dir="+filepath.Join(cp.Dir, "etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// A throwaway local store: durability across power loss buys nothing
		// and fsync dominates write latency on small VMs.
		"--unsafe-no-fsync",
		"--log-level=warn",
	)
	return clientURL, err
}

func (cp *ControlPlane) startAPIServer(port int, advertise net.IP, etcdURL string, opts Options) error {
	f := cp.PKI
	bind := "127.0.0.1"
	if !advertise.IsLoopback() {
		bind = "0.0.0.0"
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bind,
		"--advertise-address=" + advertise.String(),
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + f.ServingCert,
		"--tls-private-key-file=" + f.ServingKey,
		"--client-ca-file=" + f.ClusterCA,
		"--service-cluster-ip-range=" + cp.ServiceClusterIPRange,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + f.ServiceAccountKey,
		"--service-account-signing-key-file=" + f.ServiceAccountKey,
		// Aggregation layer: the apiserver proxies /apis/<aggregated group>
		// with this client certificate and the caller's identity in headers.
		"--requestheader-client-ca-file=" + f.FrontProxyCA,
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-uid-headers=X-Remote-Uid",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + f.ProxyClientCert,
		"--proxy-client-key-file=" + f.ProxyClientKey,
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
	if opts.ForNode {
		args = append(args,
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			// The `kubernetes` Service's endpoint is the advertise address,
			// which in-cluster clients reach through kube-proxy.
			"--endpoint-reconciler-type=lease",
			"--kubelet-client-certificate="+f.KubeletClientCert,
			"--kubelet-client-key="+f.KubeletClientKey,
			// Reaching a kubelet by its hostname would ask the machine's
			// resolver, which the node must never use.
			"--kubelet-preferred-address-types=InternalIP",
		)
	} else {
		args = append(args,
			"--authorization-mode=RBAC",
			// No kube-controller-manager runs here, so nothing would create
			// the default ServiceAccount that this admission plugin insists on.
			"--disable-admission-plugins=ServiceAccount",
			// The `kubernetes` Service's endpoints would be the advertise
			// address, and endpoint validation forbids loopback ones.
			"--endpoint-reconciler-type=none",
		)
	}
	if opts.AuditPolicy != "" {
		policy := filepath.Join(cp.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(opts.AuditPolicy), 0o600); err != nil {
			return err
		}
		cp.AuditLog = filepath.Join(cp.Dir, "audit.log")
		// The log backend's default mode is blocking: an event is in the
		// file before the request is answered.
		args = append(args, "--audit-policy-file="+policy, "--audit-log-path="+cp.AuditLog, "--audit-log-format=json")
	}
	cp.apiserverArgs = append(args, opts.ExtraAPIServerFlags...)
	_, err := cp.spawn("kube-apiserver", cp.apiserverArgs...)
	return err
}

// RestartAPIServer kills kube-apiserver, runs whileDown (with etcd still
// up: a test can change storage that no watcher sees), starts it again with
// the same flags and waits until it is ready. A restarted apiserver has an
// empty watch cache, so clients resuming a watch from an older
// resourceVersion get 410 Gone — the way to make a client relist for real.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, whileDown func(ctx context.Context) error) error {
	// A crash, not a graceful shutdown: the apiserver would wait for open
	// watches to drain, and clients must cope with both anyway.
	cp.KillProcess("kube-apiserver")
	if whileDown != nil {
		if err := whileDown(ctx); err != nil {
			return err
		}
	}
	if _, err := cp.spawn("kube-apiserver", cp.apiserverArgs...); err != nil {
		return err
	}
	return cp.waitReady(ctx)
}

// spawn starts a binary from BinDir with its output in <Dir>/<name>.log. The
// child gets its own process group (so Stop can signal everything it forked)
// and SIGKILL when the parent dies, so a crashed test leaves no orphans.
func (cp *ControlPlane) spawn(name string, args ...string) (*process, error) {
	return cp.spawnBinary(cp.netns, name, filepath.Join(cp.BinDir, name), args...)
}

// StartProcess runs another binary (an aggregated server such as the
// cache-server) as part of the control plane: its output goes to
// <Dir>/<name>.log, it dies with this process (no orphans), and Stop
// terminates it before the apiserver and etcd. Exited reports its end.
func (cp *ControlPlane) StartProcess(name, binary string, args ...string) (exited <-chan struct{}, logPath string, err error) {
	return cp.StartProcessIn(cp.netns, name, binary, args...)
}

// StartProcessIn is StartProcess in the network namespace netns (a path,
// as Options.NetNS; "" the caller's own): the process of a machine beside
// the control plane's, such as a node's kubelet, which lives and dies with
// the cluster all the same.
func (cp *ControlPlane) StartProcessIn(netns, name, binary string, args ...string) (exited <-chan struct{}, logPath string, err error) {
	p, err := cp.spawnBinary(netns, name, binary, args...)
	if err != nil {
		return nil, "", err
	}
	return p.done, p.log, nil
}

// Exited returns an error naming the first process of the control plane
// that has exited, with its last log lines; nil while all run. Waits that
// depend on a process call it so that they fail fast instead of timing out.
func (cp *ControlPlane) Exited() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, p := range cp.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v); last log lines:\n%s", p.name, p.err, LogTail(p.log, 30))
		default:
		}
	}
	return nil
}

// PID is the process ID of a process started by StartProcess (its
// resident memory is read from /proc/<pid>/status), 0 when there is no
// such running process.
func (cp *ControlPlane) PID(name string) int {
	for _, p := range cp.procs {
		if p.name == name && p.cmd.Process != nil {
			return p.cmd.Process.Pid
		}
	}
	return 0
}

// StopProcess stops a process started by StartProcess (SIGTERM to its
// process group, SIGKILL after stopGrace) before the rest of the control plane,
// for callers whose teardown has an order. Stopping an unknown or already
// stopped name does nothing.
func (cp *ControlPlane) StopProcess(name string) error {
	if p := cp.forget(name); p != nil {
		return stopProcess(p)
	}
	return nil
}

// KillProcess kills a process started by StartProcess at once, and
// everything in its process group — SIGKILL, as a machine's crash ends
// it — and waits until it is gone. Killing an unknown or already stopped
// name does nothing.
func (cp *ControlPlane) KillProcess(name string) {
	if p := cp.forget(name); p != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// forget removes the process called name from the ones Exited and Stop
// look at, and returns it (nil when there is none).
func (cp *ControlPlane) forget(name string) *process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i, p := range cp.procs {
		if p.name == name {
			cp.procs = append(cp.procs[:i:i], cp.procs[i+1:]...)
			return p
		}
	}
	return nil
}

func (cp *ControlPlane) spawnBinary(netns, name, binary string, args ...string) (*process, error) {
	logPath := filepath.Join(cp.Dir, name+".log")
	// Appended to: a process started again (a restarted apiserver or
	// node) keeps the story of its earlier run above its own.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	if netns != "" {
		// nsenter enters only the network namespace and execs the binary in
		// place (it forks only for a PID namespace), so the PID, process
		// group and parent-death signal below are the binary's own. Not
		// `ip netns exec`: it remounts /sys, which hides the cgroup mounts
		// from the kubelet.
		cmd = exec.Command("nsenter", append([]string{"--net=" + netns, "--", binary}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	cp.mu.Lock()
	cp.procs = append(cp.procs, p)
	cp.mu.Unlock()
	fmt.Fprintf(cp.log, "started %s (pid %d, log %s)\n", name, cmd.Process.Pid, logPath)
	return p, nil
}

func (cp *ControlPlane) waitReady(ctx context.Context) error {
	cfg, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last string
	for {
		if err := cp.Exited(); err != nil {
			return fmt.Errorf("during start-up: %w", err)
		}
		last = probe(ctx, httpClient, cp.URL+"/readyz")
		if last == "" {
			last = probe(ctx, httpClient, cp.URL+"/api/v1/namespaces/default")
			if last == "" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apiserver not ready: %s; last log lines:\n%s", last, LogTail(filepath.Join(cp.Dir, "kube-apiserver.log"), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// probe returns "" when url answers 200, else a description of what it got.
func probe(ctx context.Context, c *http.Client, url string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return fmt.Sprintf("%s: %d %s", url, resp.StatusCode, bytes.TrimSpace(body))
}

// RESTConfig returns an admin (system:masters) client configuration.
func (cp *ControlPlane) RESTConfig() (*rest.Config, error) {
	if cp.AdminKubeconfig == "" {
		kp, err := cp.ClusterCA.IssueClient("admin", []string{"system:masters"})
		if err != nil {
			return nil, err
		}
		return &rest.Config{Host: cp.URL, TLSClientConfig: rest.TLSClientConfig{
			CAData: cp.ClusterCA.CertPEM, CertData: kp.CertPEM, KeyData: kp.KeyPEM}}, nil
	}
	return clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig)
}

// UserKubeconfig issues a client certificate for user (groups become its
// organizations) and writes a kubeconfig for it; it returns the file's path.
// Non-admin users have no permissions until RBAC grants them some.
func (cp *ControlPlane) UserKubeconfig(user string, groups ...string) (string, error) {
	kp, err := cp.ClusterCA.IssueClient(user, groups)
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.ClusterCA.CertPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts[user] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = user
	path := filepath.Join(cp.Dir, "kubeconfig-"+sanitize(user))
	return path, clientcmd.WriteToFile(*cfg, path)
}

// RewriteKubeconfig writes kubeconfig in to out with every cluster's server
// URL set to server (and, when ca is not nil, its CA and TLS server name
// replaced): the same user reaching another endpoint, such as a profile's
// aggregated path.
func RewriteKubeconfig(in, out, server string, ca []byte, serverName string) error {
	cfg, err := clientcmd.LoadFromFile(in)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = server
		if ca != nil {
			c.CertificateAuthority = ""
			c.CertificateAuthorityData = ca
			c.TLSServerName = serverName
		}
	}
	return clientcmd.WriteToFile(*cfg, out)
}

// Kubectl is the path of the kubectl built with the control plane.
func (cp *ControlPlane) Kubectl() string { return filepath.Join(cp.BinDir, "kubectl") }

// RunKubectl runs kubectl with the given kubeconfig and returns its
// combined output.
func (cp *ControlPlane) RunKubectl(ctx context.Context, kubeconfig string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, cp.Kubectl(), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Stop terminates the apiserver then etcd (SIGTERM, SIGKILL after stopGrace) and
// removes the working directory if Start created it. Safe to call twice.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() {
		var errs []error
		cp.mu.Lock()
		procs := cp.procs
		cp.procs = nil
		cp.mu.Unlock()
		for i := len(procs) - 1; i >= 0; i-- {
			errs = append(errs, stopProcess(procs[i]))
		}
		if cp.removeDir {
			errs = append(errs, os.RemoveAll(cp.Dir))
		}
		cp.stopErr = errors.Join(errs...)
	})
	return cp.stopErr
}

// stopGrace is how long a component has to exit after SIGTERM. Two
// minutes: kube-apiserver's graceful termination waits for its in-flight
// requests (each bounded by its 60 s request timeout) and for its HTTP
// server's shutdown (bounded by the same 60 s). After e2e/nodes killed
// nodes, connections from their dead pods and requests proxied to them
// keep it there: CI saw it still running 15 s and then 60 s after
// SIGTERM, its last log line "Stopped listening", every test passed. A
// kill there says nothing about cachetier; one past both bounds does.
const stopGrace = 2 * time.Minute

// stopProcess sends SIGTERM to the process group and SIGKILL after
// stopGrace, naming the component and its last log lines if it had to.
func stopProcess(p *process) error {
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s did not stop within %s of SIGTERM; killed. Last log lines:\n%s", p.name, stopGrace, LogTail(p.log, 20))
	}
}

// FindBinDir resolves the directory with the control-plane binaries.
func FindBinDir() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "k8s", DefaultKubernetesVersion+"-linux-amd64"), nil
}

// RepoRoot walks up from the working directory to cachetier's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(data, []byte("module github.com/cachetier/cachetier\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cachetier repository root not found above the working directory; set KUBEBUILDER_ASSETS")
		}
		dir = parent
	}
}

// freePort picks a free loopback port of this machine (see freeport for
// why not :0); inside a network namespace of its own the control plane is
// alone and uses the well-known port instead.
func (cp *ControlPlane) freePort(wellKnown int) (int, error) {
	if cp.netns != "" {
		return wellKnown, nil
	}
	return freeport.Loopback()
}

// firstServiceIP is the address the apiserver gives the `kubernetes` Service;
// it must be in the serving certificate for in-cluster clients.
func firstServiceIP(cidr string) net.IP {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return net.ParseIP("127.0.100.1")
	}
	ip := n.IP.To4()
	if ip == nil {
		return net.ParseIP("127.0.100.1")
	}
	out := make(net.IP, 4)
	copy(out, ip)
	out[3]++
	return out
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// LogTail returns the last n lines of a log file, for error messages that
// should say why a process did not come up.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

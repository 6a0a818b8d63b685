// Package tierproc runs the cache-server as a real `cache-server standalone`
// process behind a local control plane's aggregation layer, the way a
// cluster runs it: listening on a Service ClusterIP (inside the control
// plane's loopback service range) with a serving certificate for the
// Service's DNS name, registered by an APIService. `make run` and the
// aggregated end-to-end tests use it.
package tierproc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// Build compiles the cache-server binary to out (go build from the
// repository root).
func Build(ctx context.Context, out string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cache-server")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cache-server: %w: %s", err, b)
	}
	return nil
}

// Options describe one tier process.
type Options struct {
	// Binary is the cache-server executable.
	Binary string
	// Profile names the CacheProfile (aggpath.For(Profile) its paths).
	Profile string
	Spec    v1alpha1.CacheProfileSpec
	// Namespace and ServiceName of the Service the APIService points at
	// (defaults cachetier-system / cachetier-<profile>).
	Namespace, ServiceName string
	// ServiceIPIndex picks the ClusterIP cp.ServiceIP(n) (default 50).
	ServiceIPIndex int
	// Port the tier listens on at the ClusterIP (default 8443).
	Port int
	// Verbosity is the cache-server's -v.
	Verbosity int
	// Kubeconfig is how every process of the tier reaches the apiserver
	// (default: the control plane's admin kubeconfig). Tests give the
	// tier its own identity, or a path through something between it and
	// the apiserver.
	Kubeconfig string
	// ExtraArgs are appended to the standalone or front command line.
	ExtraArgs []string
}

// Tier is a running, registered tier process.
type Tier struct {
	Profile string
	// Paths are the profile's aggregated paths (group, the group-version's
	// path, and the prefix users read through).
	Paths     aggpath.Paths
	ClusterIP string
	Port      int
	// DirectURL reaches the process itself (https://<ClusterIP>:<port>);
	// DirectCA verifies its serving certificate.
	DirectURL string
	DirectCA  []byte
	// ServerName is the Service DNS name in the serving certificate.
	ServerName string
	// AggregatedURL is the apiserver URL plus Paths.Prefix (what the
	// operator puts in status.serverURL): a kubeconfig with this server URL
	// reaches the tier through the aggregation layer, and the apiserver
	// treats every request through it as long-running.
	AggregatedURL string
	// RootURL is the apiserver URL plus Paths.Root, the server URL of the
	// first releases: it reaches the tier too, but the apiserver cuts its
	// watches at its --request-timeout.
	RootURL string
	// ProfileFile is the manifest the process was started with; Log its
	// output.
	ProfileFile, Log string
	// Exited is closed when the process ends.
	Exited <-chan struct{}
	// Process is the name the control plane knows the process by
	// (controlplane.ControlPlane.PID, StopProcess).
	Process string

	cp *controlplane.ControlPlane
}

// Start writes the profile, starts the process as part of cp (so cp.Stop
// stops it first), waits until it serves /readyz, and registers it with an
// APIService that the aggregator reports Available.
func Start(ctx context.Context, cp *controlplane.ControlPlane, opts Options) (*Tier, error) {
	opts = withDefaults(cp, opts)
	t := newTier(cp, opts)

	dir := filepath.Join(cp.Dir, "tier-"+opts.Profile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	t.ProfileFile = filepath.Join(dir, "profile.yaml")
	if err := writeProfile(t.ProfileFile, opts); err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	args := []string{"standalone",
		"--profile=" + t.ProfileFile,
		"--kubeconfig=" + opts.Kubeconfig,
		"--listen=" + net.JoinHostPort(t.ClusterIP, strconv.Itoa(t.Port)),
		"--cert-dir=" + certDir,
		"--tls-hosts=" + strings.Join([]string{t.ServerName, opts.ServiceName + "." + opts.Namespace, t.ClusterIP, "127.0.0.1", "localhost"}, ","),
		"-v=" + strconv.Itoa(opts.Verbosity),
	}
	args = append(args, opts.ExtraArgs...)
	t.Process = "cache-server-" + opts.Profile
	exited, logPath, err := cp.StartProcess(t.Process, opts.Binary, args...)
	if err != nil {
		return nil, err
	}
	t.Exited, t.Log = exited, logPath
	if err := t.waitReady(ctx, certDir); err != nil {
		return nil, err
	}
	if err := t.register(ctx, opts); err != nil {
		return nil, err
	}
	return t, nil
}

// register creates the Service, EndpointSlice and APIService that make the
// aggregator send the profile's group to the process.
func (t *Tier) register(ctx context.Context, opts Options) error {
	return t.cp.RegisterAPIService(ctx, controlplane.APIServiceRegistration{
		Group: t.Paths.Group, Version: v1alpha1.AggregatedAPIVersion, Namespace: opts.Namespace, ServiceName: opts.ServiceName,
		ClusterIP: t.ClusterIP, Port: int32(t.Port), CABundle: t.DirectCA,
	})
}

// writeProfile writes the CacheProfile manifest the process reads.
func writeProfile(path string, opts Options) error {
	return writeYAML(path, v1alpha1.CacheProfile{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheProfile"},
		ObjectMeta: metav1.ObjectMeta{Name: opts.Profile},
		Spec:       opts.Spec,
	})
}

func withDefaults(cp *controlplane.ControlPlane, opts Options) Options {
	if opts.Kubeconfig == "" {
		opts.Kubeconfig = cp.AdminKubeconfig
	}
	if opts.Namespace == "" {
		opts.Namespace = "cachetier-system"
	}
	if opts.ServiceName == "" {
		opts.ServiceName = "cachetier-" + opts.Profile
	}
	if opts.ServiceIPIndex == 0 {
		opts.ServiceIPIndex = 50
	}
	if opts.Port == 0 {
		opts.Port = 8443
	}
	return opts
}

// newTier computes where a tier of opts is reached.
func newTier(cp *controlplane.ControlPlane, opts Options) *Tier {
	t := &Tier{
		Profile: opts.Profile, Paths: aggpath.For(opts.Profile),
		ClusterIP: cp.ServiceIP(opts.ServiceIPIndex), Port: opts.Port,
		ServerName: opts.ServiceName + "." + opts.Namespace + ".svc", cp: cp,
	}
	t.AggregatedURL = t.Paths.ServerURL(cp.URL)
	t.RootURL = t.Paths.RootServerURL(cp.URL)
	t.DirectURL = "https://" + net.JoinHostPort(t.ClusterIP, strconv.Itoa(t.Port))
	return t
}

// waitReady waits for the generated CA and then for /readyz (every cached
// resource synced).
func (t *Tier) waitReady(ctx context.Context, certDir string) error {
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for {
		select {
		case <-t.Exited:
			return fmt.Errorf("cache-server exited during start-up; log %s:\n%s", t.Log, controlplane.LogTail(t.Log, 20))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if t.DirectCA == nil {
			if ca, err := os.ReadFile(filepath.Join(certDir, "ca.crt")); err == nil && len(ca) > 0 {
				t.DirectCA = ca
			}
		}
		if t.DirectCA != nil {
			if last = t.probe("/readyz"); last == "" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cache-server not ready after 90s (%s); log %s:\n%s", last, t.Log, controlplane.LogTail(t.Log, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (t *Tier) probe(path string) string {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(t.DirectCA)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: t.ServerName},
	}}
	resp, err := c.Get(t.DirectURL + path)
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("%s: %d", path, resp.StatusCode)
	}
	return ""
}

// AggregatedKubeconfig rewrites kubeconfig (a control-plane kubeconfig of
// some user) so that its server URL is the aggregated path of the tier, and
// writes it to out. kubectl and client-go then read through the tier
// unchanged, with the user's own identity.
func (t *Tier) AggregatedKubeconfig(kubeconfig, out string) error {
	return controlplane.RewriteKubeconfig(kubeconfig, out, t.AggregatedURL, nil, "")
}

// RootKubeconfig is AggregatedKubeconfig with the server URL of the first
// releases (RootURL), whose watches the apiserver cuts at its request
// timeout.
func (t *Tier) RootKubeconfig(kubeconfig, out string) error {
	return controlplane.RewriteKubeconfig(kubeconfig, out, t.RootURL, nil, "")
}

// DirectKubeconfig rewrites kubeconfig to talk to the tier process itself
// (its ClusterIP), bypassing the aggregator: handy for /metrics.
func (t *Tier) DirectKubeconfig(kubeconfig, out string) error {
	return controlplane.RewriteKubeconfig(kubeconfig, out, t.DirectURL, t.DirectCA, t.ServerName)
}

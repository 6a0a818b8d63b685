// Package tiertest starts what the tier's end-to-end tests need: a real
// control plane (hack/controlplane), optional sample data, and a standalone
// tier in front of it, with client configurations for both that carry the
// same admin identity so every request can be sent to each and compared.
package tiertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/internal/pki"
)

// Options configure an Env.
type Options struct {
	// ProfileName determines the aggregated path prefix.
	ProfileName string
	Spec        v1alpha1.CacheProfileSpec
	// Seed runs after the control plane is up and before the tier starts.
	Seed func(ctx context.Context, admin *rest.Config) error
	// ServiceClusterIPRange of the control plane; pick one per test
	// package so packages running in parallel do not collide.
	ServiceClusterIPRange string
	// ExtraAPIServerFlags are passed to kube-apiserver (e.g. feature gates).
	ExtraAPIServerFlags []string
	// Verbose logs the tier to stderr.
	Verbose bool
	// FleetShards, when positive, also starts a fleet next to the
	// standalone tier: that many shard servers (hash shards split into
	// contiguous ranges, as the operator assigns them) and a front over
	// them, all in this process on loopback (Env.FleetAdmin).
	FleetShards int
	// FleetReplicas is the number of replicas of each shard (default 1),
	// all in the topology's endpoints.
	FleetReplicas int
}

// Env is a running control plane plus tier.
type Env struct {
	CP *controlplane.ControlPlane
	// Admin talks to the apiserver, TierAdmin to the tier, both as admin.
	Admin, TierAdmin *rest.Config
	// TierKubeconfig is a kubeconfig for kubectl against the tier.
	TierKubeconfig string
	TierURL        string
	// FleetAdmin talks to the fleet's front as admin (Options.FleetShards),
	// FleetKubeconfig is a kubeconfig for kubectl against it.
	FleetAdmin      *rest.Config
	FleetKubeconfig string

	opts     Options
	listener string
	cert     tls.Certificate
	cancel   context.CancelFunc
	done     chan error

	fleetCtx    context.Context
	fleetCancel context.CancelFunc
	fleetDone   sync.WaitGroup
	shards      [][]*fleetShard // [shard][replica]
}

// Start brings everything up; Stop tears it down.
func Start(ctx context.Context, opts Options) (*Env, error) {
	if opts.ProfileName == "" {
		opts.ProfileName = "e2e"
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceClusterIPRange: opts.ServiceClusterIPRange, ExtraAPIServerFlags: opts.ExtraAPIServerFlags})
	if err != nil {
		return nil, err
	}
	e := &Env{CP: cp, opts: opts}
	ok := false
	defer func() {
		if !ok {
			e.Stop()
		}
	}()
	if e.Admin, err = cp.RESTConfig(); err != nil {
		return nil, err
	}
	// Tests create objects by the thousand; client-go's default 5 QPS
	// would spend minutes in its own rate limiter.
	e.Admin.QPS, e.Admin.Burst = 1000, 2000
	if opts.Seed != nil {
		start := time.Now()
		if err := opts.Seed(ctx, e.Admin); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		fmt.Fprintf(os.Stderr, "tiertest: seeded in %s\n", time.Since(start).Round(time.Millisecond))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e.listener = ln.Addr().String()
	ca, kp, err := pki.SelfSignedServing("tier", []string{"127.0.0.1"})
	if err != nil {
		return nil, err
	}
	if e.cert, err = tls.X509KeyPair(kp.CertPEM, kp.KeyPEM); err != nil {
		return nil, err
	}
	e.TierURL = "https://" + e.listener
	e.TierAdmin = rest.CopyConfig(e.Admin)
	e.TierAdmin.Host = e.TierURL
	e.TierAdmin.CAData = ca.CertPEM
	if e.TierKubeconfig, err = e.writeKubeconfig("kubeconfig-tier", e.TierURL); err != nil {
		return nil, err
	}
	if err := e.startTier(ctx, ln); err != nil {
		return nil, err
	}
	if opts.FleetShards > 0 {
		if err := e.startFleet(ctx); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	ok = true
	return e, nil
}

// writeKubeconfig writes a kubeconfig for kubectl against server (the
// tier's CA, the admin's client certificate) into the control plane's
// directory.
func (e *Env) writeKubeconfig(name, server string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tier"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: e.TierAdmin.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: e.Admin.CertData, ClientKeyData: e.Admin.KeyData}
	cfg.Contexts["tier"] = &clientcmdapi.Context{Cluster: "tier", AuthInfo: "admin"}
	cfg.CurrentContext = "tier"
	path := filepath.Join(e.CP.Dir, name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

func (e *Env) startTier(ctx context.Context, ln net.Listener) error {
	start := time.Now()
	tierCtx, cancel := context.WithCancel(ctx)
	e.cancel, e.done = cancel, make(chan error, 1)
	verbosity := 0
	if e.opts.Verbose {
		verbosity = 1
	}
	log := funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, "tier:", p, a) }, funcr.Options{Verbosity: verbosity})
	go func() {
		e.done <- standalone.Run(tierCtx, standalone.Config{
			ProfileName: e.opts.ProfileName, Spec: e.opts.Spec, Upstream: e.Admin,
			Listener: ln, Certificate: e.cert, Log: log,
		})
	}()
	if err := e.waitReady(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "tiertest: tier synced in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// waitReady polls /readyz until every cached resource is synced.
func (e *Env) waitReady() error {
	return waitReady(e.TierAdmin, e.done)
}

// waitReady polls a server's /readyz until it answers 200, the server
// exits (done) or a minute passed.
func waitReady(cfg *rest.Config, done <-chan error) error {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			return fmt.Errorf("exited: %v", err)
		default:
		}
		resp, err := client.Get(cfg.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 60s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Run is the body of a test package's TestMain: it starts an Env, hands it
// to use (to keep clients in package variables), runs the tests and tears
// everything down. It returns the exit code for os.Exit.
func Run(m *testing.M, opts Options, use func(*Env)) int {
	e, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tiertest setup:", err)
		return 1
	}
	defer e.Stop()
	use(e)
	return m.Run()
}

// Metric returns the value of one series (name{labels} exactly as the
// tier's /metrics prints it), or "" when the tier does not export it.
func (e *Env) Metric(series string) (string, error) {
	lines, err := e.scrapeMetrics()
	if err != nil {
		return "", err
	}
	for _, line := range lines {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimPrefix(line, series+" "), nil
		}
	}
	return "", nil
}

// Series returns every series of the metric name (name{labels} as the
// tier's /metrics prints it) with its value: none when no series exists
// yet (a labelled counter appears when first counted).
func (e *Env) Series(name string) (map[string]float64, error) {
	lines, err := e.scrapeMetrics()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range lines {
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("/metrics: %q: %w", line, err)
		}
		out[series] = v
	}
	return out, nil
}

// scrapeMetrics reads the tier's /metrics, one line each.
func (e *Env) scrapeMetrics() ([]string, error) {
	client, err := rest.HTTPClientFor(e.TierAdmin)
	if err != nil {
		return nil, err
	}
	resp, err := client.Get(e.TierURL + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return strings.Split(string(body), "\n"), nil
}

// RestartTier stops the tier and starts a new one on the same address
// with empty caches, as a pod restart would.
func (e *Env) RestartTier(ctx context.Context) error {
	e.stopTier()
	ln, err := net.Listen("tcp", e.listener)
	if err != nil {
		return err
	}
	return e.startTier(ctx, ln)
}

func (e *Env) stopTier() {
	if e.cancel != nil {
		e.cancel()
		<-e.done
		e.cancel = nil
	}
}

// Stop tears down the tier and the control plane.
func (e *Env) Stop() {
	e.stopTier()
	if e.fleetCancel != nil {
		e.fleetCancel()
		e.fleetDone.Wait()
	}
	if e.CP != nil {
		_ = e.CP.Stop()
	}
}

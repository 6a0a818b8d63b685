package tierproc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/freeport"
	"github.com/cachetier/cachetier/internal/pki"
)

// FleetOptions describe a fleet: Shards `cache-server shard` processes and
// one `cache-server front` over them.
type FleetOptions struct {
	Options
	// Shards is the number of shard processes (hash shards are split into
	// contiguous ranges as the operator assigns them).
	Shards int
}

// Fleet is a running, registered fleet.
type Fleet struct {
	*Tier
	// FrontMetricsURL is the front's plain-HTTP probe and metrics address;
	// ShardMetricsURLs the shards'.
	FrontMetricsURL  string
	ShardMetricsURLs []string
	// ShardAddrs are the shards' HTTPS API addresses (host:port), which
	// only the front calls.
	ShardAddrs []string
	// ShardLogs are the shard processes' outputs.
	ShardLogs []string
}

// StartFleet starts the shard processes on loopback, the front on the
// Service ClusterIP as Start does, with one CA for every serving
// certificate (as the operator issues them) and the flags the operator's
// pods use; waits until the front is ready and registers it with an
// APIService.
func StartFleet(ctx context.Context, cp *controlplane.ControlPlane, opts FleetOptions) (*Fleet, error) {
	opts.Options = withDefaults(cp, opts.Options)
	if opts.Shards < 1 {
		return nil, fmt.Errorf("a fleet needs at least one shard")
	}
	hashShards := int(opts.Spec.HashShards)
	if hashShards == 0 {
		hashShards = int(v1alpha1.DefaultHashShards)
	}
	if opts.Shards > hashShards {
		return nil, fmt.Errorf("%d shards for %d hash shards", opts.Shards, hashShards)
	}
	t := newTier(cp, opts.Options)
	dir := filepath.Join(cp.Dir, "fleet-"+opts.Profile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := writeProfile(filepath.Join(dir, "profile.yaml"), opts.Options); err != nil {
		return nil, err
	}
	t.ProfileFile = filepath.Join(dir, "profile.yaml")
	certs, err := pki.WriteServingFiles(dir, t.ServerName, []string{t.ServerName, "localhost"}, []net.IP{net.ParseIP(t.ClusterIP), net.ParseIP("127.0.0.1")})
	if err != nil {
		return nil, err
	}
	certFile, keyFile, caFile := certs.CertFile, certs.KeyFile, certs.CAFile
	t.DirectCA = certs.CAPEM

	f := &Fleet{Tier: t}
	topo := topology.Topology{HashShards: int32(hashShards)}
	for i, r := range topology.Assign(int32(hashShards), int32(opts.Shards)) {
		addr, err := freeport.LoopbackAddr()
		if err != nil {
			return nil, err
		}
		metrics, err := freeport.LoopbackAddr()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("%s-shard-%d", opts.Profile, i)
		topo.Shards = append(topo.Shards, topology.Shard{Name: name, FirstHashShard: r.First, LastHashShard: r.Last, Replicas: 1, Endpoints: []string{addr}})
		_, log, err := cp.StartProcess(name, opts.Binary, "shard",
			"--profile="+t.ProfileFile, "--kubeconfig="+opts.Kubeconfig, "--shard-name="+name,
			fmt.Sprintf("--hash-shards=%d-%d", r.First, r.Last), "--listen="+addr, "--metrics-listen="+metrics,
			"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "-v="+strconv.Itoa(opts.Verbosity))
		if err != nil {
			return nil, err
		}
		f.ShardMetricsURLs = append(f.ShardMetricsURLs, "http://"+metrics)
		f.ShardAddrs = append(f.ShardAddrs, addr)
		f.ShardLogs = append(f.ShardLogs, log)
	}
	topoFile := filepath.Join(dir, "topology.yaml")
	if err := writeYAML(topoFile, topo); err != nil {
		return nil, err
	}
	frontMetrics, err := freeport.LoopbackAddr()
	if err != nil {
		return nil, err
	}
	f.FrontMetricsURL = "http://" + frontMetrics
	t.Process = "front-" + opts.Profile
	exited, log, err := cp.StartProcess(t.Process, opts.Binary, append([]string{"front",
		"--profile=" + t.ProfileFile, "--topology=" + topoFile, "--kubeconfig=" + opts.Kubeconfig,
		"--api-group=" + t.Paths.Group, "--listen=" + net.JoinHostPort(t.ClusterIP, strconv.Itoa(t.Port)),
		"--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile, "--shard-ca-file=" + caFile,
		"--metrics-listen=" + frontMetrics, "-v=" + strconv.Itoa(opts.Verbosity)}, opts.ExtraArgs...)...)
	if err != nil {
		return nil, err
	}
	t.Exited, t.Log = exited, log
	if err := f.waitFrontReady(ctx); err != nil {
		return nil, err
	}
	if err := t.register(ctx, opts.Options); err != nil {
		return nil, err
	}
	return f, nil
}

// waitFrontReady polls the front's probe port until every resource's
// fleet streams started (which needs every shard synced).
func (f *Fleet) waitFrontReady(ctx context.Context) error {
	deadline := time.Now().Add(90 * time.Second)
	last := ""
	for {
		select {
		case <-f.Exited:
			return fmt.Errorf("front exited during start-up; log %s:\n%s", f.Log, controlplane.LogTail(f.Log, 20))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := http.Get(f.FrontMetricsURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && f.probe("/readyz") == "" {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("front not ready after 90s (%s); log %s:\n%s", last, f.Log, controlplane.LogTail(f.Log, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func writeYAML(path string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

package tiertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/cache-server/internal/fleet"
	"github.com/cachetier/cachetier/cache-server/internal/frontrole"
	"github.com/cachetier/cachetier/cache-server/internal/shardrole"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
	"github.com/cachetier/cachetier/internal/pki"
)

// startFleet starts Options.FleetShards shards and a front, each on its own
// loopback port with its own TLS certificate (one CA for the shards, as the
// operator's), authenticating to each other and to the apiserver as admin.
func (e *Env) startFleet(ctx context.Context) error {
	start := time.Now()
	settings, err := standalone.EffectiveSettings(e.opts.Spec)
	if err != nil {
		return err
	}
	n := e.opts.FleetShards
	if n > settings.HashShards {
		return fmt.Errorf("%d shards for %d hash shards", n, settings.HashShards)
	}
	ctx, cancel := context.WithCancel(ctx)
	e.fleetCancel = cancel
	log := funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, "fleet:", p, a) }, funcr.Options{Verbosity: 0})
	shardCA, shardKP, err := pki.SelfSignedServing("shards", []string{"127.0.0.1"})
	if err != nil {
		return err
	}
	shardCert, err := tls.X509KeyPair(shardKP.CertPEM, shardKP.KeyPEM)
	if err != nil {
		return err
	}
	errc := make(chan error, n+1)
	e.fleetCtx = ctx
	topo := &topology.Topology{HashShards: int32(settings.HashShards)}
	first := 0
	for i := range n {
		// Contiguous ranges, the first HashShards%n one larger (the
		// operator's assignment).
		size := settings.HashShards / n
		if i < settings.HashShards%n {
			size++
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s-shard-%d", e.opts.ProfileName, i)
		topo.Shards = append(topo.Shards, topology.Shard{
			Name: name, FirstHashShard: int32(first), LastHashShard: int32(first + size - 1), Replicas: 1,
			Endpoints: []string{ln.Addr().String()},
		})
		sh := &fleetShard{cfg: shardrole.Config{
			Name: name, Spec: e.opts.Spec, First: first, Last: first + size - 1,
			Upstream: e.Admin, Listener: ln, Certificate: shardCert, Log: log.WithValues("shard", name),
		}}
		e.shards = append(e.shards, sh)
		e.runShard(sh, errc)
		first += size
	}
	// The front's shard client as cache-server front builds it: the
	// shards' CA from a file, the front's own credentials.
	caFile := filepath.Join(e.CP.Dir, "shards-ca.crt")
	if err := os.WriteFile(caFile, shardCA.CertPEM, 0o600); err != nil {
		return err
	}
	shardClient, err := fleet.NewHTTPClient(e.Admin, caFile)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.FleetAdmin = rest.CopyConfig(e.TierAdmin)
	e.FleetAdmin.Host = "https://" + ln.Addr().String()
	if e.FleetKubeconfig, err = e.writeKubeconfig("kubeconfig-fleet", e.FleetAdmin.Host); err != nil {
		return err
	}
	e.fleetDone.Add(1)
	go func() {
		defer e.fleetDone.Done()
		errc <- frontrole.Run(ctx, frontrole.Config{
			ProfileName: e.opts.ProfileName, Spec: e.opts.Spec, Topology: topo, Upstream: e.Admin,
			ShardClient: shardClient, Listener: ln, Certificate: e.cert, Log: log.WithValues("role", "front"),
		})
	}()
	if err := waitReady(e.FleetAdmin, errc); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "tiertest: fleet of %d shards synced in %s\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}

// fleetShard is one running shard of the fleet.
type fleetShard struct {
	cfg    shardrole.Config
	cancel context.CancelFunc
	done   chan struct{}
}

func (e *Env) runShard(sh *fleetShard, errc chan<- error) {
	ctx, cancel := context.WithCancel(e.fleetCtx)
	sh.cancel, sh.done = cancel, make(chan struct{})
	e.fleetDone.Add(1)
	go func() {
		defer e.fleetDone.Done()
		defer close(sh.done)
		err := shardrole.Run(ctx, sh.cfg)
		if errc != nil {
			errc <- err
		}
	}()
}

// RestartShard stops shard i of the fleet and starts a new one with an
// empty cache on the same address, as a shard pod's restart would.
func (e *Env) RestartShard(i int) error {
	sh := e.shards[i]
	addr := sh.cfg.Listener.Addr().String()
	sh.cancel()
	<-sh.done
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	sh.cfg.Listener = ln
	e.runShard(sh, nil)
	return nil
}

// Fleet is an Env whose tier is the fleet's front (Options.FleetShards):
// TierAdmin, TierKubeconfig, TierURL and Metric address the front; the
// control plane is shared. RestartTier is not available on it.
func (e *Env) Fleet() *Env {
	return &Env{CP: e.CP, Admin: e.Admin, TierAdmin: e.FleetAdmin, TierKubeconfig: e.FleetKubeconfig, TierURL: e.FleetAdmin.Host, opts: e.opts}
}

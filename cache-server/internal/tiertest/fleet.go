package tiertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
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
	n, replicas := e.opts.FleetShards, max(e.opts.FleetReplicas, 1)
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
	errc := make(chan error, n*replicas+1)
	e.fleetCtx = ctx
	topo := &topology.Topology{HashShards: int32(settings.HashShards)}
	for i, rg := range topology.Assign(int32(settings.HashShards), int32(n)) {
		name := fmt.Sprintf("%s-shard-%d", e.opts.ProfileName, i)
		ts := topology.Shard{Name: name, FirstHashShard: rg.First, LastHashShard: rg.Last, Replicas: int32(replicas)}
		var group []*fleetShard
		for r := range replicas {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			probe, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			ts.Endpoints = append(ts.Endpoints, ln.Addr().String())
			sh := &fleetShard{cfg: shardrole.Config{
				Name: name, Spec: e.opts.Spec, First: int(rg.First), Last: int(rg.Last),
				Upstream: e.Admin, Listener: ln, ProbeListener: probe, Certificate: shardCert, Log: log.WithValues("shard", name, "replica", r),
			}}
			group = append(group, sh)
			e.runShard(sh, errc)
		}
		topo.Shards = append(topo.Shards, ts)
		e.shards = append(e.shards, group)
	}
	// The front's shard client as cache-server front builds it: the
	// shards' CA from a file, the front's own credentials.
	caFile := filepath.Join(e.CP.Dir, "shards-ca.crt")
	if err := os.WriteFile(caFile, shardCA.CertPEM, 0o600); err != nil {
		return err
	}
	shardClient, err := fleet.NewHTTPClient(e.Admin, caFile, nil)
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

// RestartShard stops every replica of shard i, runs whileDown (may be
// nil), and starts new replicas with empty caches on the same addresses, as
// a rollout of the whole shard would: the shard's history is gone.
func (e *Env) RestartShard(i int, whileDown func()) error {
	for r := range e.shards[i] {
		e.StopShardReplica(i, r)
	}
	if whileDown != nil {
		whileDown()
	}
	for r := range e.shards[i] {
		if err := e.StartShardReplica(i, r); err != nil {
			return err
		}
	}
	return nil
}

// StopShardReplica stops replica r of shard i (its pod is gone).
func (e *Env) StopShardReplica(i, r int) {
	sh := e.shards[i][r]
	sh.cancel()
	<-sh.done
}

// RerangeShardReplica restarts replica r of shard i holding hash shards
// first..last instead, as a rollout that changes the shard count replaces
// the shard's pods one at a time; the front keeps its topology.
func (e *Env) RerangeShardReplica(i, r, first, last int) error {
	e.StopShardReplica(i, r)
	e.shards[i][r].cfg.First, e.shards[i][r].cfg.Last = first, last
	return e.StartShardReplica(i, r)
}

// StartShardReplica starts a stopped replica again with an empty cache on
// its addresses and waits until it is ready (its probe's /readyz).
func (e *Env) StartShardReplica(i, r int) error {
	sh := e.shards[i][r]
	ln, err := net.Listen("tcp", sh.cfg.Listener.Addr().String())
	if err != nil {
		return err
	}
	probe, err := net.Listen("tcp", sh.cfg.ProbeListener.Addr().String())
	if err != nil {
		ln.Close()
		return err
	}
	sh.cfg.Listener, sh.cfg.ProbeListener = ln, probe
	e.runShard(sh, nil)
	url := "http://" + probe.Addr().String() + "/readyz"
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shard %d replica %d not ready after 60s: %v", i, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Fleet is an Env whose tier is the fleet's front (Options.FleetShards):
// TierAdmin, TierKubeconfig, TierURL and Metric address the front; the
// control plane is shared. RestartTier is not available on it.
func (e *Env) Fleet() *Env {
	return &Env{CP: e.CP, Admin: e.Admin, TierAdmin: e.FleetAdmin, TierKubeconfig: e.FleetKubeconfig, TierURL: e.FleetAdmin.Host, opts: e.opts}
}

package main

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/freeport"
	"github.com/cachetier/cachetier/internal/pki"
)

// startFleet runs the tier as shards `cache-server shard` processes and a
// `cache-server front` listening on addr (the flags the operator's pods
// use), and waits until the front is ready.
func startFleet(cp *controlplane.ControlPlane, admin *rest.Config, binary, flags, env, dir, profPath, addr string, shards, hashShards int) (*tierProc, error) {
	certs, err := pki.WriteServingFiles(dir, "bench-fleet", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		return nil, err
	}
	certFile, keyFile, caFile := certs.CertFile, certs.KeyFile, certs.CAFile
	var cmds []*exec.Cmd
	var done []chan struct{}
	var names []string
	stop := func() {
		for _, c := range cmds {
			_ = c.Process.Signal(os.Interrupt)
		}
		for i, c := range cmds {
			select {
			case <-done[i]:
			case <-time.After(10 * time.Second):
				_ = c.Process.Kill()
				<-done[i]
			}
		}
	}
	start := func(name string, args ...string) error {
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd := exec.Command(binary, append(args, strings.Fields(flags)...)...)
		cmd.Env = append(os.Environ(), strings.Fields(env)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return err
		}
		ch := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(ch) }()
		cmds, done, names = append(cmds, cmd), append(done, ch), append(names, name)
		return nil
	}
	alive := func() error {
		for i := range done {
			select {
			case <-done[i]:
				return exitedError("cache-server "+names[i], filepath.Join(dir, names[i]+".log"))
			default:
			}
		}
		return nil
	}
	topo := topology.Topology{HashShards: int32(hashShards)}
	for i, r := range topology.Assign(int32(hashShards), int32(shards)) {
		shardAddr, err := freeport.LoopbackAddr()
		if err != nil {
			stop()
			return nil, err
		}
		name := fmt.Sprintf("shard-%d", i)
		topo.Shards = append(topo.Shards, topology.Shard{Name: name, FirstHashShard: r.First, LastHashShard: r.Last, Replicas: 1, Endpoints: []string{shardAddr}})
		if err := start(name, "shard", "--profile", profPath, "--kubeconfig", cp.AdminKubeconfig, "--shard-name", name,
			fmt.Sprintf("--hash-shards=%d-%d", r.First, r.Last), "--listen", shardAddr,
			"--tls-cert-file", certFile, "--tls-private-key-file", keyFile); err != nil {
			stop()
			return nil, err
		}
	}
	data, err := yaml.Marshal(topo)
	if err != nil {
		stop()
		return nil, err
	}
	topoFile := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topoFile, data, 0o600); err != nil {
		stop()
		return nil, err
	}
	if err := start("front", "front", "--profile", profPath, "--topology", topoFile, "--kubeconfig", cp.AdminKubeconfig,
		"--listen", addr, "--tls-cert-file", certFile, "--tls-private-key-file", keyFile, "--shard-ca-file", caFile); err != nil {
		stop()
		return nil, err
	}
	cfg := rest.CopyConfig(admin)
	cfg.Host = "https://" + addr
	cfg.CAData, cfg.CAFile = certs.CAPEM, ""
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		stop()
		return nil, err
	}
	t := &tierProc{cfg: cfg, pid: cmds[len(cmds)-1].Process.Pid, stop: stop, alive: alive}
	for _, c := range cmds {
		t.pids = append(t.pids, c.Process.Pid)
	}
	// The shards serve /debug/pprof on their API port to a cluster admin
	// too (-profile-dir profiles them with the front).
	for _, sh := range topo.Shards {
		sc := rest.CopyConfig(cfg)
		sc.Host = "https://" + sh.Endpoints[0]
		t.parts = append(t.parts, profTarget{name: sh.Name, cfg: sc})
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if err := alive(); err != nil {
			stop()
			return nil, err
		}
		if err := cp.Exited(); err != nil {
			stop()
			return nil, err
		}
		resp, err := client.Get(cfg.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return t, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("fleet not ready after 5m; last lines of the front's log:\n%s", controlplane.LogTail(filepath.Join(dir, "front.log"), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reportFleetRSS prints each fleet process's resident set and its growth
// over the same process of a fleet caching nothing (base, in t.pids'
// order: the shards, then the front).
func reportFleetRSS(t *tierProc, base []uint64) {
	names := make([]string, 0, len(t.pids))
	for _, p := range t.parts {
		names = append(names, p.name)
	}
	names = append(names, "front")
	for i, r := range rssEach(t.pids) {
		var b uint64
		if i < len(base) {
			b = base[i]
		}
		fmt.Fprintf(os.Stderr, "bench: %s RSS %.1f MiB (%+.1f MiB over a fleet caching nothing)\n", names[i], float64(r)/(1<<20), (float64(r)-float64(b))/(1<<20))
	}
}

// fleetMemoryRows are a fleet's memory by process, next to the apiserver's
// growth: what each shard holds should be about the data set over the
// number of shards, and the front, which holds no objects, next to
// nothing. each and base are RSS per process in t.pids' order (the
// shards, then the front), with the data set cached and caching nothing.
func fleetMemoryRows(label string, t *tierProc, each, base []uint64, apiGrowth float64, jsonBytes int64) []row {
	mib := func(v float64) float64 { return v / (1 << 20) }
	growth := func(i int) float64 {
		if i >= len(each) || i >= len(base) {
			return math.NaN()
		}
		return float64(each[i]) - float64(base[i])
	}
	shards := len(t.parts)
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for i := range shards {
		g := growth(i)
		lo, hi, sum = math.Min(lo, g), math.Max(hi, g), sum+g
	}
	front := growth(shards)
	nan := math.NaN()
	return []row{
		{label, "RSS growth, all tier processes", "MiB", mib(apiGrowth), mib(sum + front), ""},
		{label, fmt.Sprintf("RSS growth, largest of %d shards", shards), "MiB", nan, mib(hi), ""},
		{label, fmt.Sprintf("RSS growth, smallest of %d shards", shards), "MiB", nan, mib(lo), ""},
		{label, "RSS growth, front", "MiB", nan, mib(front), ""},
		{label, fmt.Sprintf("data set as JSON / %d shards", shards), "MiB", nan, mib(float64(jsonBytes) / float64(shards)), ""},
	}
}

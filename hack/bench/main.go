// Command bench compares LIST cost on the tier and on kube-apiserver, side by
// side on the same data: a real control plane (hack/controlplane) and the
// tier as a separate `cache-server standalone` process, so both are measured
// the same way from /proc.
//
// For each data set (N ConfigMaps of S bytes in their own namespace; the
// tier caches only that namespace through a namespaceSelector) it measures:
//   - consistent full LIST (JSON, resourceVersion unset): p50/p99 latency and
//     CPU per LIST (utime+stime of the server process, /proc/<pid>/stat);
//   - paginated LIST (limit=500, following continue): total time, p50;
//   - memory: tier RSS after sync minus the RSS of a tier caching nothing,
//     per object, next to the object's JSON size; the apiserver's RSS growth
//     while the data set was created, per object.
//
// With -mode watchlist, fanout or watch (both) it runs the WATCH benchmarks
// instead (watch.go): concurrent watch-list informers over large Secrets
// (KEP-3157's scenario) and watch fan-out to many watchers.
//
// Usage (see docs/benchmarks.md):
//
//	go run ./hack/bench -small-count 10000 -small-size 1024 -large-count 300 -large-size 1048576
//	go run ./hack/bench -mode watch
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/freeport"
)

type dataset struct {
	name        string
	count, size int
	// resource is what the set is made of: configmaps, or pods (pods.go).
	resource string
	// nodes, for pods, is how many nodes they are bound to (0: none).
	nodes int
}

type options struct {
	sets        []dataset
	iterations  int
	pageIters   int
	concurrency int
	binary      string
	// freshness, when set, is the profile's freshnessTimeout: a
	// consistent read's wait for the tier before its 504.
	freshness time.Duration
	// profileDir, when set, receives a CPU profile of each server taken
	// while it serves full and paginated LISTs (after the measurements), and
	// in -mode nodes during each phase (profileNodePhase).
	profileDir string
	// apiProfiling turns the apiserver's /debug/pprof on without
	// -profile-dir: -mode nodes reads its dispatch from CPU profiles.
	apiProfiling bool
	// tierFlags are extra `cache-server standalone` flags (space-separated).
	tierFlags string
	// tierEnv are extra NAME=value environment variables for the tier
	// process only (e.g. GOGC), space-separated.
	tierEnv string
	// fleet, when positive, runs the tier as that many `cache-server
	// shard` processes and a `cache-server front` (LIST mode); CPU and
	// memory are the sums over all of them.
	fleet int
	// settle is the pause after a tier's warm-up reads before the
	// apiserver's idle rate is measured (wholecost.go).
	settle time.Duration
}

func main() {
	var o options
	var small, large dataset
	small.name, large.name = "small", "large"
	small.resource, large.resource = "configmaps", "configmaps"
	pods := dataset{name: "pods", resource: "pods"}
	flag.IntVar(&small.count, "small-count", 10000, "ConfigMaps in the small-object data set")
	flag.IntVar(&small.size, "small-size", 1024, "bytes of data per small ConfigMap")
	flag.IntVar(&large.count, "large-count", 300, "ConfigMaps in the large-object data set")
	flag.IntVar(&large.size, "large-size", 1<<20, "bytes of data per large ConfigMap")
	flag.IntVar(&pods.count, "pod-count", 0, "Pods in the pods-like data set (pods.go)")
	flag.IntVar(&pods.size, "pod-size", 5120, "bytes of JSON per Pod, as the apiserver serves it (managedFields included; at least the unpadded bench Pod, ~4.2 KB; -mode list and nodes)")
	flag.IntVar(&o.iterations, "iterations", 30, "full LISTs per server and data set")
	flag.IntVar(&o.pageIters, "page-iterations", 5, "paginated LIST walks per server and data set")
	flag.IntVar(&o.concurrency, "seed-concurrency", 8, "parallel creates while seeding")
	flag.StringVar(&o.binary, "cache-server", "", "cache-server binary (default: built into a temporary directory)")
	flag.StringVar(&o.tierEnv, "tier-env", "", "extra environment for the cache-server process only, space-separated NAME=value (e.g. GOGC=50)")
	flag.StringVar(&o.tierFlags, "tier-flags", "", "extra cache-server standalone flags, space-separated (e.g. \"--gc-percent=50\")")
	flag.StringVar(&o.profileDir, "profile-dir", "", "write CPU profiles of both servers here (/debug/pprof/profile, served to the admin): under LIST load, and in -mode nodes during each phase's writer run")
	flag.DurationVar(&o.freshness, "freshness-timeout", 0, "the tier profile's freshnessTimeout (default: the profile's default, 3s); the 100k-object scale run on a loaded machine needs more")
	flag.IntVar(&o.fleet, "fleet", 0, "run the tier as a fleet of this many shard processes and a front (list mode; apicost, quietread and nodes run one next to the standalone tier, default 2 shards; CPU and RSS summed over the processes)")
	mode := flag.String("mode", "list", "benchmark: list, watchlist, fanout, watch (watchlist and fanout), nodes, probecost, apicost, quietread, aggwatch or flood")
	wo := watchFlags()
	fo := freshFlags()
	no := nodesFlags()
	ao := aggWatchFlags()
	flo := floodFlags()
	flag.Parse()
	o.settle = fo.api.settle
	no.writers, no.podSize = wo.writers, pods.size
	if o.profileDir != "" {
		// Made here, not where each mode writes: a profile taken minutes
		// into a run must not be lost to a missing directory.
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench: -profile-dir:", err)
			os.Exit(1)
		}
	}
	if handled, err := runFreshMode(context.Background(), *mode, o, small, fo); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	switch *mode {
	case "list":
	case "nodes":
		if err := runNodes(context.Background(), o, no); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	case "watchlist", "fanout", "watch":
		if o.fleet > 0 {
			fmt.Fprintln(os.Stderr, "bench: -fleet is for -mode list")
			os.Exit(2)
		}
		wo.watchList = *mode != "fanout"
		wo.fanout = *mode != "watchlist"
		if err := runWatch(context.Background(), o, wo); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	case "flood":
		if err := runFlood(context.Background(), o, flo); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	case "flood-client":
		if err := runFloodClient(flo.clientSpec); err != nil {
			fmt.Fprintln(os.Stderr, "bench: flooder:", err)
			os.Exit(1)
		}
		return
	case "aggwatch":
		if err := runAggWatch(context.Background(), o, wo, ao); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	default:
		fmt.Fprintf(os.Stderr, "bench: unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	for _, d := range []dataset{small, large, pods} {
		if d.count > 0 {
			o.sets = append(o.sets, d)
		}
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type row struct {
	set, metric, unit string
	api, tier         float64
	// target, when set, is the target for the ratio and whether
	// it is met (printed in a column of its own).
	target string
}

// benchEnv is a running control plane, an admin client of its apiserver,
// the apiserver's pid and the cache-server binary to run.
type benchEnv struct {
	cp     *controlplane.ControlPlane
	admin  *rest.Config
	kc     kubernetes.Interface
	apiPID int
}

// startEnv starts the control plane and builds cache-server unless
// o.binary names one. The caller stops env.cp.
func startEnv(ctx context.Context, o *options) (env *benchEnv, err error) {
	cpo := controlplane.Options{ServiceClusterIPRange: "127.82.0.0/24"}
	if o.profileDir != "" || o.apiProfiling {
		// hack/controlplane turns the apiserver's profiling off; the
		// profiles compare the two servers.
		cpo.ExtraAPIServerFlags = []string{"--profiling=true"}
	}
	cp, err := controlplane.Start(ctx, cpo)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()
	admin, err := cp.RESTConfig()
	if err != nil {
		return nil, err
	}
	admin.QPS, admin.Burst = 2000, 4000
	kc, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	apiPID, err := findAPIServer(cp.Dir)
	if err != nil {
		return nil, err
	}
	if o.binary == "" {
		o.binary = filepath.Join(cp.Dir, "cache-server")
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", o.binary, "./cache-server")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build cache-server: %v: %s", err, out)
		}
	}
	return &benchEnv{cp: cp, admin: admin, kc: kc, apiPID: apiPID}, nil
}

func run(ctx context.Context, o options) error {
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	cp, admin, kc, apiPID := env.cp, env.admin, env.kc, env.apiPID
	defer cp.Stop()
	// A tier caching nothing gives the baseline RSS.
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-empty", Labels: map[string]string{"bench": "empty"}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// Per resource: caching pods (field selectors computed at ingestion)
	// and configmaps do not start from the same floor.
	baseRSS, baseEach := map[string]uint64{}, map[string][]uint64{}
	for _, d := range o.sets {
		if _, done := baseRSS[d.resource]; done {
			continue
		}
		base, err := startTier(ctx, cp, admin, o.binary, o.tierFlags, o.tierEnv, "empty", d.resource, o.fleet, o.freshness)
		if err != nil {
			return err
		}
		baseRSS[d.resource], baseEach[d.resource] = rssAll(base.pids), rssEach(base.pids)
		base.stop()
		fmt.Fprintf(os.Stderr, "bench: RSS of a tier caching no %s %.1f MiB\n", d.resource, float64(baseRSS[d.resource])/(1<<20))
	}

	var rows []row
	for _, d := range o.sets {
		ns := "bench-" + d.name
		apiBefore := rss(apiPID)
		start := time.Now()
		jsonBytes, err := seed(ctx, kc, ns, d, o.concurrency)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: seeded %d x %d B in %s\n", d.count, d.size, time.Since(start).Round(time.Millisecond))
		time.Sleep(2 * time.Second)
		apiAfter := rss(apiPID)

		t, err := startTier(ctx, cp, admin, o.binary, o.tierFlags, o.tierEnv, d.name, d.resource, o.fleet, o.freshness)
		if err != nil {
			return err
		}
		time.Sleep(2 * time.Second)
		tierRSS, tierEach := rssAll(t.pids), rssEach(t.pids)
		if o.fleet > 0 {
			reportFleetRSS(t, baseEach[d.resource])
		}
		if o.profileDir != "" {
			if err := saveTierMemory(t.cfg, filepath.Join(o.profileDir, d.name+"-tier"), true); err != nil {
				t.stop()
				return err
			}
			for _, p := range t.parts {
				if err := saveTierMemory(p.cfg, filepath.Join(o.profileDir, d.name+"-tier-"+p.name), true); err != nil {
					t.stop()
					return err
				}
			}
		}
		path := "/api/v1/namespaces/" + ns + "/" + d.resource
		servers := []struct {
			cfg   *rest.Config
			pids  []int
			parts []profTarget
		}{{admin, []int{apiPID}, nil}, {t.cfg, t.pids, t.parts}}
		var res [2]measure
		for i, s := range servers {
			if res[i], err = measureServer(s.cfg, s.pids, apiPID, path, o); err != nil {
				t.stop()
				return err
			}
			if o.profileDir != "" {
				name := filepath.Join(o.profileDir, fmt.Sprintf("%s-%s", d.name, []string{"apiserver", "tier"}[i]))
				if err := profileServer(s.cfg, path, name, s.parts); err != nil {
					t.stop()
					return err
				}
			}
		}
		// After the LISTs: what serving them left resident (the tier's
		// kept compressed chunks, see package gzipchunks; garbage not yet
		// collected on both sides).
		apiServed, tierServed := rss(apiPID), rssAll(t.pids)
		kept := math.NaN()
		if o.fleet == 0 {
			if kept, err = metricValue(t.cfg, "cachetier_list_gzip_cache_bytes"); err != nil {
				t.stop()
				return err
			}
		}
		t.stop()
		perObj := float64(jsonBytes) / float64(d.count)
		label := fmt.Sprintf("%s (%d x %s)", d.name, d.count, human(d.size))
		rows = append(rows,
			row{label, "full LIST p50", "ms", res[0].p50, res[1].p50, ""},
			row{label, "full LIST p99", "ms", res[0].p99, res[1].p99, ""},
			row{label, "CPU per full LIST", "ms", res[0].cpuPerList, res[1].cpuPerList, ""},
			row{label, "apiserver CPU the tier's LIST causes (idle subtracted)", "ms", math.NaN(), res[1].causedPerList, ""},
			row{label, "whole CPU per full LIST above idle (tier: + what it causes)", "ms", res[0].wholePerList, res[1].wholePerList, ""},
			row{label, "paginated LIST (limit=500) total p50", "ms", res[0].pagedP50, res[1].pagedP50, ""},
			row{label, "full LIST p50, client gunzips all (client-go)", "ms", res[0].decodedP50, res[1].decodedP50, ""},
			row{label, "paginated total p50, client gunzips all", "ms", res[0].decodedPagedP50, res[1].decodedPagedP50, ""},
			row{label, "resident bytes per object", "B", float64(int64(apiAfter)-int64(apiBefore)) / float64(d.count), float64(int64(tierRSS)-int64(baseRSS[d.resource])) / float64(d.count), ""},
			row{label, "object JSON size", "B", perObj, perObj, ""},
			row{label, "full LIST body on the wire (gzip)", "KiB", res[0].wireBytes / 1024, res[1].wireBytes / 1024, ""},
			row{label, "resident bytes per object after the LISTs", "B", float64(int64(apiServed)-int64(apiBefore)) / float64(d.count), float64(int64(tierServed)-int64(baseRSS[d.resource])) / float64(d.count), ""},
			row{label, "compressed LIST chunks kept per object", "B", math.NaN(), kept / float64(d.count), ""},
		)
		if o.fleet > 0 {
			rows = append(rows, fleetMemoryRows(label, t, tierEach, baseEach[d.resource], float64(int64(apiAfter)-int64(apiBefore)), jsonBytes)...)
		}
	}
	printTable(os.Stdout, rows)
	return nil
}

type tierProc struct {
	cfg *rest.Config
	// pid is the process serving cfg (standalone, or the fleet's front);
	// pids every process of the tier.
	pid  int
	pids []int
	// parts are a fleet's shards, profiled with the front (-profile-dir).
	parts []profTarget
	stop  func()
	// alive returns an error with the last log lines of a process of the
	// tier that exited, nil while all run.
	alive func() error
}

// exitedError is the error for a tier process that exited: its log's last
// lines (fail fast with the reason, not "see the log").
func exitedError(name, logPath string) error {
	return fmt.Errorf("%s exited; last lines of %s:\n%s", name, logPath, controlplane.LogTail(logPath, 30))
}

// startTier runs `cache-server standalone` caching the given core/v1
// resource in the namespaces labelled bench=<set>, and waits until it is
// ready.
func startTier(ctx context.Context, cp *controlplane.ControlPlane, admin *rest.Config, binary, flags, env, set, resource string, shards int, freshness time.Duration) (*tierProc, error) {
	spec := v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{{
		Version: "v1", Resource: resource,
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": set}},
	}}}
	if freshness > 0 {
		spec.FreshnessTimeout = &metav1.Duration{Duration: freshness}
	}
	prof := v1alpha1.CacheProfile{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheProfile"}, ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: spec}
	data, err := yaml.Marshal(prof)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cp.Dir, "tier-"+set)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	profPath := filepath.Join(dir, "profile.yaml")
	if err := os.WriteFile(profPath, data, 0o644); err != nil {
		return nil, err
	}
	addr, err := freeport.LoopbackAddr()
	if err != nil {
		return nil, err
	}
	if shards > 0 {
		return startFleet(cp, admin, binary, flags, env, dir, profPath, addr, shards, int(spec.HashShards))
	}
	logPath := filepath.Join(dir, "tier.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"standalone", "--profile", profPath, "--kubeconfig", cp.AdminKubeconfig, "--listen", addr, "--cert-dir", dir}
	cmd := exec.Command(binary, append(args, strings.Fields(flags)...)...)
	cmd.Env = append(os.Environ(), strings.Fields(env)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	cfg := rest.CopyConfig(admin)
	cfg.Host = "https://" + addr
	cfg.CAData, cfg.CAFile = nil, ""
	cfg.Insecure = true // the tier's self-signed certificate; the bench measures, it does not authenticate the server
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		stop()
		return nil, err
	}
	alive := func() error {
		select {
		case <-done:
			return exitedError("cache-server standalone", logPath)
		default:
			return nil
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if err := alive(); err != nil {
			logf.Close()
			return nil, err
		}
		if err := cp.Exited(); err != nil {
			stop()
			return nil, err
		}
		resp, err := client.Get(cfg.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return &tierProc{cfg: cfg, pid: cmd.Process.Pid, pids: []int{cmd.Process.Pid}, stop: stop, alive: alive}, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("tier not ready after 5m; last lines of %s:\n%s", logPath, controlplane.LogTail(logPath, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// seed creates the data set's namespace and ConfigMaps and returns the
// total size of their JSON as the apiserver serves them.
func seed(ctx context.Context, kc kubernetes.Interface, ns string, d dataset, concurrency int) (int64, error) {
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"bench": d.name}}}, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	if d.resource == "pods" {
		return seedPods(ctx, kc, ns, d, concurrency)
	}
	payload := strings.Repeat("x", d.size)
	err := createAll(ctx, 0, d.count, concurrency, func(ctx context.Context, i int) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%06d", i)}, Data: map[string]string{"payload": payload}}
		_, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return 0, err
	}
	return listSize(ctx, kc, ns, "configmaps")
}

// createAll runs create(i) for i in [from, to) on concurrency workers and
// returns the first error; once one failed, no more are started.
func createAll(ctx context.Context, from, to, concurrency int, create func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for i := from; i < to && gctx.Err() == nil; i++ {
		g.Go(func() error { return create(gctx, i) })
	}
	return g.Wait()
}

// listSize is the size of the JSON LIST of resource in ns as the apiserver
// serves it: the data set's size against which memory is compared.
func listSize(ctx context.Context, kc kubernetes.Interface, ns, resource string) (int64, error) {
	body, err := kc.CoreV1().RESTClient().Get().Namespace(ns).Resource(resource).DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	return int64(len(body)), nil
}

type measure struct {
	p50, p99, cpuPerList, pagedP50 float64
	// causedPerList is, for a tier, the apiserver's CPU per full LIST
	// above its idle rate: the RV fetches and progress probes the LISTs
	// made the tier send (wholecost.go). wholePerList is what a full LIST
	// costs every process above idle: the apiserver's CPU minus its idle
	// rate when it serves the LIST itself; the tier's CPU plus
	// causedPerList when the tier does.
	causedPerList, wholePerList float64
	// wireBytes is the last full LIST's body as sent (gzip).
	wireBytes float64
	// The same with a client that decompresses every byte with Go's
	// compress/gzip, as client-go and kubectl do.
	decodedP50, decodedPagedP50 float64
}

// measureServer measures the LISTs of path on the server at cfg, whose
// processes are pids; apiPID is the apiserver's (one of pids when it is
// the server measured).
func measureServer(cfg *rest.Config, pids []int, apiPID int, path string, o options) (measure, error) {
	var m measure
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return m, err
	}
	var wire int64
	list := func(q string, decodeAll bool) (string, error) {
		req, _ := http.NewRequest(http.MethodGet, cfg.Host+path+q, nil)
		req.Header.Set("Accept", "application/json")
		// Asked for explicitly, so the transport leaves the body as sent
		// (Go's transport only decompresses what it asked for itself).
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := client.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			return "", fmt.Errorf("%s%s: %d %s", cfg.Host, path, resp.StatusCode, b)
		}
		wire = 0
		resp.Body = countingBody{resp.Body, &wire}
		return readPage(resp, decodeAll)
	}
	full := func(decodeAll bool) ([]float64, error) {
		var lat []float64
		for range o.iterations {
			start := time.Now()
			if _, err := list("", decodeAll); err != nil {
				return nil, err
			}
			lat = append(lat, ms(time.Since(start)))
		}
		return lat, nil
	}
	walks := func(decodeAll bool) ([]float64, error) {
		var paged []float64
		for range o.pageIters {
			start := time.Now()
			for cont := ""; ; {
				q := "?limit=500"
				if cont != "" {
					q += "&continue=" + cont
				}
				if cont, err = list(q, decodeAll); err != nil {
					return nil, err
				}
				if cont == "" {
					break
				}
			}
			paged = append(paged, ms(time.Since(start)))
		}
		return paged, nil
	}
	// Warm up (and fill the tier's caches).
	if _, err := list("", false); err != nil {
		return m, err
	}
	apiIsServer := slices.Contains(pids, apiPID)
	if !apiIsServer {
		// The warm-up's progress probes must not run in the idle window.
		time.Sleep(o.settle)
	}
	idle := idleCPU(apiPID, 0)
	cpu0, api0, t0 := cpuTicksAll(pids), cpuTicks(apiPID), time.Now()
	lat, err := full(false)
	if err != nil {
		return m, err
	}
	cpu1, api1 := cpuTicksAll(pids), cpuTicks(apiPID)
	apiAbove := aboveIdle(api1-api0, idle, time.Since(t0)) / float64(o.iterations)
	m.wireBytes = float64(wire)
	m.p50, m.p99 = pct(lat, 50), pct(lat, 99)
	m.cpuPerList = ticksMs(cpu1-cpu0) / float64(o.iterations)
	if apiIsServer {
		m.causedPerList, m.wholePerList = math.NaN(), apiAbove
	} else {
		m.causedPerList, m.wholePerList = apiAbove, m.cpuPerList+apiAbove
	}
	paged, err := walks(false)
	if err != nil {
		return m, err
	}
	m.pagedP50 = pct(paged, 50)
	if lat, err = full(true); err != nil {
		return m, err
	}
	m.decodedP50 = pct(lat, 50)
	if paged, err = walks(true); err != nil {
		return m, err
	}
	m.decodedPagedP50 = pct(paged, 50)
	return m, nil
}

// countingBody counts the bytes read from a response body.
type countingBody struct {
	io.ReadCloser
	n *int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	*c.n += int64(n)
	return n, err
}

// clkTck is USER_HZ, 100 on every Linux architecture Go supports here.
const clkTck = 100

// cpuTicks is utime+stime of a process, in clock ticks.
func cpuTicks(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	// Fields after the command name (which may contain spaces) start
	// after the last ')'; utime and stime are fields 14 and 15.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return ut + st
}

// cpuTicksAll sums cpuTicks over processes.
func cpuTicksAll(pids []int) uint64 {
	var n uint64
	for _, p := range pids {
		n += cpuTicks(p)
	}
	return n
}

// runQueueWaits is how long each thread of a process has waited on a
// CPU's run queue, runnable but not running (the second field of
// /proc/<pid>/task/<tid>/schedstat), by thread ID. On a machine whose
// cores the servers and clients share, it tells a request that waited
// for a core apart from one that waited in the server: Go's own
// scheduler cannot see a thread the kernel has not run.
func runQueueWaits(pid int) map[string]time.Duration {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	out := make(map[string]time.Duration, len(tasks))
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) == 3 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			out[fmt.Sprintf("%d/%s", pid, t.Name())] = time.Duration(ns)
		}
	}
	return out
}

// runQueueMeter adds up the run-queue wait of processes' threads between
// samples. Threads come and go (Go ends one whose goroutine exits locked
// to it), so a total of the live ones could shrink: each sample adds each
// thread's growth since the last, and a thread first seen counts from
// zero. A thread's wait between its last sample and its exit is lost.
type runQueueMeter struct {
	pids  []int
	last  map[string]time.Duration
	total time.Duration
}

func newRunQueueMeter(pids []int) *runQueueMeter {
	m := &runQueueMeter{pids: pids}
	m.last = m.read()
	return m
}

func (m *runQueueMeter) read() map[string]time.Duration {
	all := map[string]time.Duration{}
	for _, p := range m.pids {
		maps.Copy(all, runQueueWaits(p))
	}
	return all
}

// sample adds the growth since the last sample and returns the total.
func (m *runQueueMeter) sample() time.Duration {
	now := m.read()
	for tid, w := range now {
		if w > m.last[tid] {
			m.total += w - m.last[tid]
		}
	}
	m.last = now
	return m.total
}

// rssEach is rss of each process.
func rssEach(pids []int) []uint64 {
	out := make([]uint64, len(pids))
	for i, p := range pids {
		out[i] = rss(p)
	}
	return out
}

// rssAll sums rss over processes.
func rssAll(pids []int) uint64 {
	var n uint64
	for _, p := range pids {
		n += rss(p)
	}
	return n
}

// rss is a process's resident set size in bytes.
func rss(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// findAPIServer finds the control plane's kube-apiserver process: the one
// whose command line mentions the control plane's directory.
func findAPIServer(dir string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "kube-apiserver") && strings.Contains(string(cmdline), dir) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no kube-apiserver process for %s", dir)
}

func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func human(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	targets := slices.ContainsFunc(rows, func(r row) bool { return r.target != "" })
	head := "data set\tmetric\tunit\tkube-apiserver\ttier\ttier/apiserver\t"
	if targets {
		head += "target\t"
	}
	fmt.Fprintln(tw, head)
	// NaN marks a value that does not apply to one server.
	num := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		if v != 0 && math.Abs(v) < 1 { // CPU per update or per small LIST
			return fmt.Sprintf("%.3f", v)
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, r := range rows {
		ratio := "-"
		if r.api > 0 && !math.IsNaN(r.tier) {
			ratio = fmt.Sprintf("%.2f", r.tier/r.api)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t", r.set, r.metric, r.unit, num(r.api), num(r.tier), ratio)
		if targets {
			line += r.target + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	_ = tw.Flush()
}

// readPage reads a LIST response to the end and returns its
// metadata.continue. Both servers gzip bodies over 128 KiB. With decodeAll
// the client decompresses every byte, as client-go and kubectl do; on this
// 2-core machine the client's own gunzip (compress/gzip inflates these
// bodies slower than the tier compresses them) then bounds the tier's
// times. Otherwise it decompresses only until it has the list's metadata
// and reads the rest as it arrives on the wire: the time is the server's
// work plus the transfer, which is what the targets compare.
func readPage(resp *http.Response, decodeAll bool) (string, error) {
	var body io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return "", err
		}
		body = zr
	}
	cont, err := continueOf(body)
	if err != nil {
		return "", err
	}
	if decodeAll {
		_, err = io.Copy(io.Discard, body)
	} else {
		_, err = io.Copy(io.Discard, resp.Body)
	}
	return cont, err
}

// continueOf returns a JSON list's metadata.continue, reading r only as far
// as the list's metadata (both servers write it before the items; any order
// works).
func continueOf(r io.Reader) (string, error) {
	dec := json.NewDecoder(r)
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", fmt.Errorf("list body does not start with an object: %v %v", tok, err)
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		if key != "metadata" {
			var skip json.RawMessage // kind, apiVersion (items only if a server put them first)
			if err := dec.Decode(&skip); err != nil {
				return "", err
			}
			continue
		}
		var meta struct {
			Continue string `json:"continue"`
		}
		if err := dec.Decode(&meta); err != nil {
			return "", err
		}
		return meta.Continue, nil
	}
	return "", nil
}

// profileServer takes two 10-second CPU profiles of a server: while a
// client sends consistent full LISTs of path back to back, and while it
// walks path with limit=500. name gets "-full.pprof" / "-paged.pprof".
// parts (a fleet's shards) are profiled over the same 10 seconds, into
// name-<part>-full.pprof and so on.
func profileServer(cfg *rest.Config, path, name string, parts []profTarget) error {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	get := func(q string) (string, error) {
		resp, err := client.Get(cfg.Host + path + q)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("%s: %d", path, resp.StatusCode)
		}
		return readPage(resp, true)
	}
	full := func() error { _, err := get(""); return err }
	paged := func() error {
		for cont := ""; ; {
			q := "?limit=500"
			if cont != "" {
				q += "&continue=" + cont
			}
			var err error
			if cont, err = get(q); err != nil || cont == "" {
				return err
			}
		}
	}
	for suffix, load := range map[string]func() error{"-full.pprof": full, "-paged.pprof": paged} {
		stop := make(chan struct{})
		loadErr := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					loadErr <- nil
					return
				default:
				}
				if err := load(); err != nil {
					loadErr <- err
					return
				}
			}
		}()
		partErrs := make(chan error, len(parts))
		for _, p := range parts {
			go func() { partErrs <- saveCPUProfile(p.cfg, name+"-"+p.name+suffix) }()
		}
		err := saveCPUProfile(cfg, name+suffix)
		for range parts {
			if perr := <-partErrs; err == nil {
				err = perr
			}
		}
		close(stop)
		if lerr := <-loadErr; err == nil {
			err = lerr
		}
		if err != nil {
			return fmt.Errorf("profile %s: %w", name+suffix, err)
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s\n", name+suffix)
	}
	return nil
}

// profTarget is one more process to profile with a server.
type profTarget struct {
	name string
	cfg  *rest.Config
}

// saveCPUProfile writes a 10-second CPU profile of the server at cfg.
func saveCPUProfile(cfg *rest.Config, file string) error {
	body, err := cpuProfile(cfg, 10*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if body == nil {
		fmt.Fprintf(os.Stderr, "bench: %s serves no profiles; %s not written\n", cfg.Host, file)
		return nil
	}
	return os.WriteFile(file, body, 0o644)
}

// cpuProfile takes a CPU profile of d (whole seconds, at least 1) of the
// server at cfg: pprof's gzipped protobuf, a few hundred KiB at most. Nil
// and no error when the server serves no profiles (hack/controlplane runs
// kube-apiserver with --profiling=false; startEnv turns it on with
// -profile-dir and for -mode nodes).
func cpuProfile(cfg *rest.Config, d time.Duration) ([]byte, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	seconds := max(int((d+time.Second-1)/time.Second), 1)
	resp, err := client.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", cfg.Host, seconds))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("CPU profile of %s: %s: %s", cfg.Host, resp.Status, bytes.TrimSpace(body))
	}
	return body, nil
}

// saveTierMemory writes the tier's heap profile (name-heap.pprof) and its
// Go memory statistics from /metrics (name-metrics.txt): where its resident
// memory goes (live heap, heap not yet returned to the OS, runtime). With
// collect, the tier collects first (the metrics then show the live heap);
// otherwise the profile is as of the last collection and nothing is
// disturbed.
func saveTierMemory(cfg *rest.Config, name string, collect bool) error {
	heap := "/debug/pprof/heap"
	if collect {
		heap += "?gc=1" // before /metrics, which then shows the live heap
	}
	for _, pf := range [][2]string{{heap, name + "-heap.pprof"}, {"/metrics", name + "-metrics.txt"}} {
		path, file := pf[0], pf[1]
		body, err := getOK(cfg, path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(file, body, 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s\n", file)
	}
	return nil
}

// metricValue is the value of an unlabelled series on the tier's /metrics.
func metricValue(cfg *rest.Config, name string) (float64, error) {
	body, err := getOK(cfg, "/metrics")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no %s", name)
}

// getOK is the body of a GET of path on the server at cfg, which must
// answer 200.
func getOK(cfg *rest.Config, path string) ([]byte, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	resp, err := client.Get(cfg.Host + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s", path, resp.StatusCode, body)
	}
	return body, nil
}

func decodeJSON(r io.Reader, v any) error {
	if err := json.NewDecoder(r).Decode(v); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, r)
	return err
}

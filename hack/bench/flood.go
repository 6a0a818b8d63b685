package main

// -mode flood (issue 21): the same flood against kube-apiserver, a
// standalone tier and a fleet (2 shards + front), side by side. One user in
// the global-default flow loops -flood-lists concurrent full consistent
// LISTs of every ConfigMap for -flood-duration, then -flood-watchlists
// concurrent watch-lists of them; meanwhile a node identity (group
// system:nodes) LISTs its node's Pods every second with a watch of them
// open, and a workload identity (a ServiceAccount: service-accounts,
// workload-low) GETs a Pod -flood-gets times a second. Each server is first
// measured unloaded (the victims alone, as long as a flood), then under
// each flood.
//
// Reported per server and phase: the victims' p50/p99 and their ratio to
// the same server unloaded, their failures; the flooder's answers, its
// 429 share and whether every 429 had Retry-After; 5xx and dropped
// connections (transport errors, watches that ended early); peak RSS
// (sampled every 250 ms) and CPU (cores) of the server's processes.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/tierproc"
)

type floodOptions struct {
	duration, unloaded time.Duration
	lists, watchLists  int
	gets               int
	configMaps, cmSize int
	pods, nodes        int
	servers            string
	clientSpec         string
	clientPriority     string
	serverCPUs         string
	rounds             int
	traceDir           string
	victimsNice        int
	// tierArgs: -flood-tier-args.
	tierArgs string
}

func floodFlags() *floodOptions {
	var f floodOptions
	flag.DurationVar(&f.duration, "flood-duration", 60*time.Second, "flood: how long each flood (LISTs, then watch-lists) lasts per server")
	flag.IntVar(&f.victimsNice, "flood-victims-nice", 0, "flood: the nice value of the bench's threads — the victims' client — while servers are measured (negative: root; the flooder's process resets its own); -10 is as if the victims ran on machines of their own, the mirror of -flood-client-priority idle (tried, no better: docs/benchmarks.md); 0 runs them as any process")
	flag.StringVar(&f.traceDir, "flood-trace", "", "flood: a directory to write, for each server and phase, a Go execution trace of the bench (the victims' client) and of the server's own process (the apiserver, a standalone tier, a fleet's front; through the aggregator the tier behind it), for hack/tracewaits (tracing costs both CPU; floodtrace.go)")
	flag.IntVar(&f.rounds, "flood-rounds", 1, "flood: how many times each server runs its three phases; with more than one, a pooled row per phase takes the p50 and p99 over every round's samples (one phase's p99 of the node's 60 LISTs is its slowest)")
	flag.DurationVar(&f.unloaded, "flood-unloaded", 0, "flood: how long the victims run alone on each server first (0: as long as each flood, -flood-duration)")
	flag.IntVar(&f.lists, "flood-lists", 64, "flood: concurrent full consistent LISTs of the flooder")
	flag.IntVar(&f.watchLists, "flood-watchlists", 64, "flood: concurrent watch-lists of the flooder")
	flag.IntVar(&f.gets, "flood-gets", 20, "flood: the workload identity's GETs per second")
	flag.IntVar(&f.configMaps, "flood-configmaps", 10000, "flood: ConfigMaps (what the flooder reads)")
	flag.IntVar(&f.cmSize, "flood-configmap-size", 1024, "flood: bytes of data per ConfigMap")
	flag.IntVar(&f.pods, "flood-pods", 10000, "flood: Pods, spread over -flood-nodes nodes")
	flag.IntVar(&f.nodes, "flood-nodes", 200, "flood: nodes the Pods are bound to")
	flag.StringVar(&f.clientPriority, "flood-client-priority", "idle", "flood: the flooder process's CPU scheduling: idle (SCHED_IDLE, as if it ran on a machine of its own; floodclient.go) or normal")
	flag.StringVar(&f.serverCPUs, "flood-server-cpus", "", "flood: CPUs (a list such as 0 or 0-1) the server's processes run on while it is measured, every other process the bench started on the rest (cpuplace.go); empty: all share every CPU")
	flag.StringVar(&f.clientSpec, "flood-client-spec", "", "flood: internal, the spec of a flooder process (-mode flood-client, started by -mode flood)")
	flag.StringVar(&f.tierArgs, "flood-tier-args", "", "flood: flags added to the command line of the tier processes clients reach (a standalone tier and a fleet's front; space-separated), such as --bulk-request-nice=0 to measure without lowered bulk threads")
	flag.StringVar(&f.servers, "flood-servers", strings.Join(floodServerKeys, ","), "flood: the servers flooded, in order (comma-separated, of "+strings.Join(floodServerKeys, ", ")+")")
	return &f
}

// floodServerKeys name the servers -flood-servers selects: the apiserver,
// each tier direct (what its own priority and fairness sees), and each
// tier through the aggregator at status.serverURL (what users are given:
// kube-apiserver's APF admits the request, proxies it, and releases its
// seat at the handoff of a long-running one; the tier's APF then sees
// the user the aggregator names).
var floodServerKeys = []string{"apiserver", "standalone", "fleet", "standalone-aggregated", "fleet-aggregated"}

// floodServer is one server under test: where to send requests, and the
// processes whose RSS and CPU are measured.
type floodServer struct {
	key  string
	name string
	floodTarget
	pids []int
	// apiPID is kube-apiserver's process: its CPU in every phase is what
	// the server's traffic costs it (the tiers' RV fetches and streams).
	apiPID int
	// admin is an admin client's config for the server's own process (the
	// tier's or the fleet front's, also for the rows through the
	// aggregator): -profile-dir profiles it in each flood phase, and a
	// tier's /metrics gives its handler's time for the node's LISTs.
	admin *rest.Config
}

// floodIdentities are the clients' kubeconfigs (client certificates from
// the cluster CA, which the tier also trusts).
type floodIdentities struct{ flooder, node, workload string }

// floodClient is an HTTP client of a kubeconfig's identity to s; each
// has connections of its own (HTTP/2 multiplexes ~250 streams on one).
func floodClient(kubeconfig string, s floodTarget) (*http.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Host = s.Host
	if s.CA != nil { // a tier: its own serving CA (the apiserver's is the kubeconfig's)
		cfg.CAData, cfg.CAFile, cfg.ServerName = s.CA, "", s.ServerName
	}
	return rest.HTTPClientFor(cfg)
}

// floodTally is what a class of client saw in a phase.
type floodTally struct {
	mu  sync.Mutex
	lat []time.Duration // of the 200s
	floodCounts
}

func (t *floodTally) add(code int, retryAfter bool, d time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		t.Dropped++
	case code == http.StatusOK:
		t.OK++
		t.lat = append(t.lat, d)
	case code == http.StatusTooManyRequests:
		t.TooMany++
		if retryAfter {
			t.WithRetryAfter++
		}
	case code >= 500:
		t.S5x++
	default:
		t.Other++
	}
}

// pool adds o's latencies and counts to t's.
func (t *floodTally) pool(o *floodTally) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	t.lat = append(t.lat, o.lat...)
	t.OK += o.OK
	t.TooMany += o.TooMany
	t.WithRetryAfter += o.WithRetryAfter
	t.S5x += o.S5x
	t.Other += o.Other
	t.Dropped += o.Dropped
}

func (t *floodTally) quantile(p float64) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lat) == 0 {
		return 0
	}
	l := slices.Clone(t.lat)
	slices.Sort(l)
	return l[min(len(l)-1, int(float64(len(l))*p))]
}

// floodRead is how floodGet reads a response.
type floodRead int

const (
	// readBody reads the body to its end, inflated when the server
	// gzipped it, as client-go does.
	readBody floodRead = iota
	// readGzipped reads the body to its end as the server sent it: the
	// request asks for gzip as client-go's does (the server does the same
	// work), but the bytes are not inflated. The flooder's LISTs read so:
	// inflating ~10 MiB per LIST was most of its CPU, and on one machine
	// that CPU is taken from the servers it floods even under SCHED_IDLE
	// (floodclient.go).
	readGzipped
	// readUntilBookmark reads a watch-list up to its initial-events-end
	// bookmark.
	readUntilBookmark
)

// floodGet GETs u and reads the response as how says.
func floodGet(ctx context.Context, c *http.Client, u string, how floodRead) (int, bool, time.Duration, error) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, false, 0, err
	}
	if how == readGzipped {
		// Set by the caller, the transport leaves the body as sent.
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, 0, err
	}
	defer resp.Body.Close()
	retryAfter := resp.Header.Get("Retry-After") != ""
	if resp.StatusCode != http.StatusOK || how != readUntilBookmark {
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, retryAfter, time.Since(start), err
	}
	er := newEventReader(resp.Body)
	for {
		ev, err := er.next()
		if err != nil {
			return resp.StatusCode, retryAfter, time.Since(start), fmt.Errorf("watch-list ended before its initial-events-end bookmark: %w", err)
		}
		if strings.Contains(string(ev), `"k8s.io/initial-events-end":"true"`) {
			return resp.StatusCode, retryAfter, time.Since(start), nil
		}
	}
}

// cutByEnd: an error of a request the phase's end cut is not a dropped
// connection.
func cutByEnd(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil
}

// floodPhase is one phase's measurements on one server.
type floodPhase struct {
	name                    string
	node, workload, flooder *floodTally
	watchDrops              int64
	peakRSS, cpuMilliCores  uint64
	// apiMilliCores is kube-apiserver's CPU over the phase.
	apiMilliCores            uint64
	elapsed                  time.Duration
	nodeP50, nodeP99, getP50 time.Duration
	getP99                   time.Duration
	// handlerP99 is the bound of the tier's request-duration bucket
	// holding the 99th percentile of the node's LISTs in the phase (0: not
	// a tier, or no LIST recorded).
	handlerP99 float64
	// levelLimit is the mean current limit, in seats, of the flooder's
	// priority level (global-default) on a tier, and levelLingering the
	// share of it that requests held after they ended (the tier's
	// cachetier_priority_and_fairness_lingering_seat_seconds_total);
	// 0 for the apiserver.
	levelLimit, levelLingering float64
	// seatCPU and shardSeatCPU are the tier's CPU per seat of read work
	// at the phase's end (tierGauges).
	seatCPU, shardSeatCPU float64
	// serverRunQueue and benchRunQueue are how long the server's threads
	// (all its processes) and the bench's own (the victims' client)
	// waited for a core, per second of the phase (runQueueMeter).
	serverRunQueue, benchRunQueue time.Duration
}

// runFloodPhase runs the victims, and the flooder when flood is set
// ("lists" or "watchlists"), against s for d.
func runFloodPhase(s floodServer, ids floodIdentities, f *floodOptions, flood string, d time.Duration) (*floodPhase, error) {
	ph := &floodPhase{name: flood, node: &floodTally{}, workload: &floodTally{}, flooder: &floodTally{}}
	if flood == "" {
		ph.name = "unloaded"
	}
	nodeC, err := floodClient(ids.node, s.floodTarget)
	if err != nil {
		return nil, err
	}
	workC, err := floodClient(ids.workload, s.floodTarget)
	if err != nil {
		return nil, err
	}
	if f.traceDir != "" {
		stop, err := startFloodTrace(f.traceDir, s, ph.name, d)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := stop(); err != nil {
				fmt.Fprintln(os.Stderr, "bench: -flood-trace:", err)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	node := benchNodeName(7)
	podsOfNode := s.Host + "/api/v1/pods?fieldSelector=spec.nodeName%3D" + node
	// The node's watch stays open for the phase; ending early is a drop.
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, podsOfNode+"&watch=true&allowWatchBookmarks=true&resourceVersion=0", nil)
		resp, err := nodeC.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if ctx.Err() == nil {
			atomic.AddInt64(&ph.watchDrops, 1)
		}
	}()
	every := func(period time.Duration, fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(period)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					wg.Add(1)
					go func() { defer wg.Done(); fn() }()
				}
			}
		}()
	}
	// The victims' requests complete after the phase's end (their own
	// timeout): a cut one would be no measurement.
	victim := func(c *http.Client, u string, t *floodTally) {
		vctx, vcancel := context.WithTimeout(context.Background(), time.Minute)
		defer vcancel()
		code, ra, lat, err := floodGet(vctx, c, u, readBody)
		t.add(code, ra, lat, err)
	}
	every(time.Second, func() {
		inNodeListRegion(func() { victim(nodeC, podsOfNode+"&resourceVersion=0", ph.node) })
	})
	var n atomic.Int64
	every(time.Second/time.Duration(max(f.gets, 1)), func() {
		i := int(n.Add(1)) % f.pods
		victim(workC, fmt.Sprintf("%s/api/v1/namespaces/flood-pods/pods/%s", s.Host, benchPodName(i)), ph.workload)
	})
	var flooder *floodClientProcess
	if flood != "" {
		u, conc, how := s.Host+"/api/v1/configmaps", f.lists, readGzipped
		if flood == "watchlists" {
			u, conc, how = u+"?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", f.watchLists, readUntilBookmark
		}
		spec := floodClientSpec{Kubeconfig: ids.flooder, Server: s.floodTarget,
			URL: u, Concurrency: conc, Read: how, Duration: d, Idle: f.clientPriority == "idle"}
		if flooder, err = startFloodClient(spec); err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
	}
	before := tierNodeListBuckets(s)
	g0, _ := readTierGauges(s, floodLevel)
	var limits []float64
	// Peak RSS and CPU of the server's processes over the phase.
	cpu0, api0, t0 := cpuTicksAll(s.pids), cpuTicksAll([]int{s.apiPID}), time.Now()
	serverRQ, benchRQ := newRunQueueMeter(s.pids), newRunQueueMeter([]int{os.Getpid()})
	tick := time.NewTicker(250 * time.Millisecond)
	for n := 0; ctx.Err() == nil; n++ {
		ph.peakRSS = max(ph.peakRSS, rssAll(s.pids))
		serverRQ.sample()
		benchRQ.sample()
		if n%20 == 10 { // every 5 s: the tier's /metrics is not free
			if g, ok := readTierGauges(s, floodLevel); ok {
				limits = append(limits, g.limit)
			}
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	tick.Stop()
	ph.elapsed = time.Since(t0)
	ph.cpuMilliCores = (cpuTicksAll(s.pids) - cpu0) * 10 * 1000 / uint64(max(ph.elapsed.Milliseconds(), 1))
	ph.apiMilliCores = (cpuTicksAll([]int{s.apiPID}) - api0) * 10 * 1000 / uint64(max(ph.elapsed.Milliseconds(), 1))
	// In floating point: d × 1e9 overflows int64 beyond ~9 s of waiting.
	perSecond := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) / max(ph.elapsed.Seconds(), 0.001))
	}
	ph.serverRunQueue = perSecond(serverRQ.sample())
	ph.benchRunQueue = perSecond(benchRQ.sample())
	wg.Wait()
	if flooder != nil {
		if ph.flooder, err = flooder.wait(d); err != nil {
			return nil, err
		}
	}
	ph.nodeP50, ph.nodeP99 = ph.node.quantile(0.5), ph.node.quantile(0.99)
	ph.getP50, ph.getP99 = ph.workload.quantile(0.5), ph.workload.quantile(0.99)
	ph.handlerP99 = bucketQuantile(before, tierNodeListBuckets(s), 0.99)
	if g, ok := readTierGauges(s, floodLevel); ok && len(limits) > 0 {
		for _, l := range limits {
			ph.levelLimit += l / float64(len(limits))
		}
		ph.levelLingering = (g.lingered - g0.lingered) / (ph.levelLimit * ph.elapsed.Seconds())
		// The kind of read the phase floods with.
		kind := "list"
		if flood == "watchlists" {
			kind = "watch-list"
		}
		ph.seatCPU, ph.shardSeatCPU = g.seatCPU[kind], g.shardSeatCPU
	}
	return ph, nil
}

// floodLevel is the flooder's priority level (a user in no group of
// its own: global-default).
const floodLevel = "global-default"

// tierGauges is what a tier's /metrics says of the flooder's priority
// level and of the CPU per seat of read work it charges LISTs by.
type tierGauges struct {
	// limit is the level's current limit in seats, lingered the
	// seat-seconds its requests held after they ended so far.
	limit, lingered float64
	// seatCPU is the tier's own CPU per seat's worth of read work by
	// kind (cachetier_seat_cpu_seconds: list, watch-list), shardSeatCPU a
	// front's shards' mean (cachetier_fleet_shard_seat_cpu_seconds; 0
	// standalone).
	seatCPU      map[string]float64
	shardSeatCPU float64
}

// readTierGauges reads a tier's gauges at level; not ok for the
// apiserver or when unread.
func readTierGauges(s floodServer, level string) (g tierGauges, ok bool) {
	if s.admin == nil || s.key == "apiserver" {
		return g, false
	}
	body, err := getOK(s.admin, "/metrics")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return g, false
	}
	want := `priority_level="` + level + `"`
	for line := range strings.SplitSeq(string(body), "\n") {
		name, labels, value, ok := metricLine(line)
		if !ok {
			continue
		}
		switch {
		case name == "apiserver_flowcontrol_current_limit_seats" && strings.Contains(labels, want):
			g.limit = value
		case name == "cachetier_priority_and_fairness_lingering_seat_seconds_total" && strings.Contains(labels, want):
			g.lingered = value
		case name == "cachetier_seat_cpu_seconds":
			if g.seatCPU == nil {
				g.seatCPU = map[string]float64{}
			}
			kind, _ := strings.CutPrefix(labels, `kind="`)
			g.seatCPU[strings.TrimSuffix(kind, `"`)] = value
		case name == "cachetier_fleet_shard_seat_cpu_seconds":
			g.shardSeatCPU = max(g.shardSeatCPU, value)
		}
	}
	return g, g.limit > 0
}

// metricLine splits a text exposition sample line: name, labels
// (without braces) and value.
func metricLine(line string) (name, labels string, value float64, ok bool) {
	i := strings.LastIndexByte(line, ' ') // label values may hold spaces
	if i < 0 || strings.HasPrefix(line, "#") {
		return "", "", 0, false
	}
	head, v := line[:i], line[i+1:]
	name, labels, _ = strings.Cut(head, "{")
	value, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	return name, strings.TrimSuffix(labels, "}"), value, err == nil
}

// floodServerList is -flood-servers checked, before anything starts.
func floodServerList(flagValue string) ([]string, error) {
	var keys []string
	for _, k := range strings.Split(flagValue, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(floodServerKeys, k) {
			return nil, fmt.Errorf("-flood-servers: unknown server %q (known: %s)", k, strings.Join(floodServerKeys, ", "))
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func runFlood(ctx context.Context, o options, f *floodOptions) error {
	keys, err := floodServerList(f.servers)
	if err != nil {
		return err
	}
	if f.clientPriority != "idle" && f.clientPriority != "normal" {
		return fmt.Errorf("-flood-client-priority: %q is neither idle nor normal", f.clientPriority)
	}
	if f.rounds < 1 {
		return fmt.Errorf("-flood-rounds: %d, want 1 or more", f.rounds)
	}
	if f.victimsNice < -20 || f.victimsNice > 19 {
		return fmt.Errorf("-flood-victims-nice: %d is not a nice value (-20 to 19)", f.victimsNice)
	}
	if f.traceDir != "" {
		if err := os.MkdirAll(f.traceDir, 0o755); err != nil {
			return fmt.Errorf("-flood-trace: %w", err)
		}
	}
	placement, err := newCPUPlacement(f.serverCPUs)
	if err != nil {
		return err
	}
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	start := time.Now()
	if _, err := seed(ctx, env.kc, "flood-configmaps", dataset{name: "flood-configmaps", count: f.configMaps, size: f.cmSize, resource: "configmaps"}, o.concurrency); err != nil {
		return err
	}
	if _, err := seed(ctx, env.kc, "flood-pods", dataset{name: "flood-pods", count: f.pods, size: 5120, resource: "pods", nodes: f.nodes}, o.concurrency); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: seeded %d ConfigMaps of %d B and %d Pods on %d nodes in %s\n", f.configMaps, f.cmSize, f.pods, f.nodes, time.Since(start).Round(time.Second))
	spec := v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{{Version: "v1", Resource: "configmaps"}, {Version: "v1", Resource: "pods"}}}
	tierArgs := strings.Fields(f.tierArgs)
	st, err := tierproc.Start(ctx, env.cp, tierproc.Options{Binary: o.binary, Profile: "flood", Spec: spec, ExtraArgs: tierArgs})
	if err != nil {
		return err
	}
	fl, err := tierproc.StartFleet(ctx, env.cp, tierproc.FleetOptions{Options: tierproc.Options{Binary: o.binary, Profile: "floodfleet", Spec: spec, ServiceIPIndex: 51, ExtraArgs: tierArgs}, Shards: 2})
	if err != nil {
		return err
	}
	ids, err := floodUsers(ctx, env, st.Paths.Group, fl.Paths.Group)
	if err != nil {
		return err
	}
	fleetPIDs := []int{env.cp.PID(fl.Process)}
	for i := range 2 {
		fleetPIDs = append(fleetPIDs, env.cp.PID(fmt.Sprintf("floodfleet-shard-%d", i)))
	}
	stDirect := floodTarget{Host: st.DirectURL, CA: st.DirectCA, ServerName: st.ServerName}
	flDirect := floodTarget{Host: fl.DirectURL, CA: fl.DirectCA, ServerName: fl.ServerName}
	byKey := map[string]floodServer{}
	for _, s := range []floodServer{
		{key: "apiserver", name: "kube-apiserver", floodTarget: floodTarget{Host: env.admin.Host}, pids: []int{env.apiPID}, admin: env.admin},
		{key: "standalone", name: "tier standalone", floodTarget: stDirect, pids: []int{env.cp.PID(st.Process)}, admin: tierAdmin(env.admin, stDirect)},
		{key: "fleet", name: "tier fleet (2 shards + front)", floodTarget: flDirect, pids: fleetPIDs, admin: tierAdmin(env.admin, flDirect)},
		// Through the aggregator the apiserver works too (authentication,
		// its own APF, the proxy): its RSS and CPU are counted with the
		// tier's.
		{key: "standalone-aggregated", name: "tier standalone via aggregator (+ apiserver)", floodTarget: floodTarget{Host: st.AggregatedURL}, pids: []int{env.cp.PID(st.Process), env.apiPID}, admin: tierAdmin(env.admin, stDirect)},
		{key: "fleet-aggregated", name: "tier fleet via aggregator (+ apiserver)", floodTarget: floodTarget{Host: fl.AggregatedURL}, pids: append(slices.Clone(fleetPIDs), env.apiPID), admin: tierAdmin(env.admin, flDirect)},
	} {
		s.apiPID = env.apiPID
		byKey[s.key] = s
	}
	var servers []floodServer
	for _, k := range keys {
		servers = append(servers, byKey[k])
	}
	if placement != nil {
		fmt.Printf("placement: %s\n", placement)
	}
	// After every server started (they must not inherit it): the
	// victims' client — this process — at a priority of its own if asked.
	// On one machine it waits for a core behind the servers it measures,
	// which a kubelet on its node does not (floodtrace.go's traces: once
	// 7.5 ms of a 10.6 ms LIST after its response was read); at -10 the
	// ratios were no better (its sampling and the workload's GETs then
	// take the servers' cores), so it is not the default.
	if f.victimsNice != 0 {
		if err := setNice(f.victimsNice); err != nil {
			return fmt.Errorf("-flood-victims-nice %d (0 to keep the bench's priority): %w", f.victimsNice, err)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server\tphase\tnode LIST p50 ms\tp99 ms\tp99 / unloaded\tworkload GET p50 ms\tp99 ms\tp99 / unloaded\tvictims' failures\tflooder 200\t429\t429 share\t429 with Retry-After\t5xx (all)\tdropped (all)\tpeak RSS MiB\tCPU cores\ttier handler p99 ms\tserver run-queue wait ms/s\tbench run-queue wait ms/s\tapiserver CPU cores\tflooder's level seats (lingering)\tCPU per seat µs (+ shards')\t")
	for _, s := range servers {
		if err := runFloodServer(tw, s, ids, f, o, placement); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// runFloodServer measures one server: unloaded, then under each flood,
// with placement (when set) holding it on CPUs of its own.
func runFloodServer(tw io.Writer, s floodServer, ids floodIdentities, f *floodOptions, o options, placement *cpuPlacement) error {
	if placement != nil {
		if err := placement.place(s.pids); err != nil {
			return err
		}
		defer func() {
			if err := placement.release(); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
		}()
		fmt.Fprintf(os.Stderr, "bench: %s: %s\n", s.name, placement)
		// The Go processes' GOMAXPROCS follows their CPUs within a second
		// or so; the phases measure the placed servers.
		time.Sleep(3 * time.Second)
	}
	phases := []string{"", "lists", "watchlists"}
	pooled := map[string][]*floodPhase{}
	for round := 1; round <= f.rounds; round++ {
		label, profileDir := s.name, o.profileDir
		if f.rounds > 1 {
			label = fmt.Sprintf("%s, round %d", s.name, round)
		}
		if round > 1 {
			profileDir = "" // one profile per phase: the first round's
		}
		var base *floodPhase
		for _, phase := range phases {
			d := f.duration
			if phase == "" && f.unloaded > 0 {
				// The unloaded phase lasts as long as a flood by
				// default: a p99 of the node's 1 LIST a second is
				// nearly the slowest of the phase's samples, and the
				// slowest of 20 is lower than the slowest of 60 drawn
				// from the same latencies, which made every
				// "p99 / unloaded" of a 20 s baseline read high.
				d = f.unloaded
			}
			fmt.Fprintf(os.Stderr, "bench: %s: %s for %s\n", label, map[string]string{"": "unloaded", "lists": "LIST flood", "watchlists": "watch-list flood"}[phase], d)
			profiled := profileFloodPhase(s, phase, profileDir, d)
			ph, err := runFloodPhase(s, ids, f, phase, d)
			if perr := profiled(); err == nil {
				err = perr
			}
			if err != nil {
				return err
			}
			if base == nil {
				base = ph
			}
			writeFloodRow(tw, label, ph, base)
			pooled[phase] = append(pooled[phase], ph)
		}
	}
	if f.rounds > 1 {
		var base *floodPhase
		for _, phase := range phases {
			ph := poolFloodPhases(pooled[phase])
			if base == nil {
				base = ph
			}
			writeFloodRow(tw, s.name+", pooled", ph, base)
		}
	}
	return nil
}

// poolFloodPhases is the same phase of several rounds as one: the node's
// and the workload's latencies of every round together (p50 and p99 over
// all of them: with the node's one LIST a second, a 60 s phase's p99 is
// its slowest sample, three rounds' the second slowest of 180), counts
// summed, the peak RSS and the tier's handler bound the highest of the
// rounds, CPU and run-queue waits averaged over the rounds' time.
func poolFloodPhases(phs []*floodPhase) *floodPhase {
	out := &floodPhase{name: phs[0].name, node: &floodTally{}, workload: &floodTally{}, flooder: &floodTally{}}
	var cpu, api, serverRQ, benchRQ, limit, lingering float64
	for _, ph := range phs {
		out.node.pool(ph.node)
		out.workload.pool(ph.workload)
		out.flooder.pool(ph.flooder)
		out.watchDrops += ph.watchDrops
		out.peakRSS = max(out.peakRSS, ph.peakRSS)
		out.handlerP99 = max(out.handlerP99, ph.handlerP99)
		sec := ph.elapsed.Seconds()
		out.elapsed += ph.elapsed
		cpu += float64(ph.cpuMilliCores) * sec
		api += float64(ph.apiMilliCores) * sec
		serverRQ += float64(ph.serverRunQueue) * sec
		benchRQ += float64(ph.benchRunQueue) * sec
		limit += ph.levelLimit * sec
		lingering += ph.levelLingering * ph.levelLimit * sec
		// Learned as the rounds go: the last round's.
		out.seatCPU, out.shardSeatCPU = ph.seatCPU, ph.shardSeatCPU
	}
	if sec := out.elapsed.Seconds(); sec > 0 {
		out.cpuMilliCores = uint64(cpu / sec)
		out.apiMilliCores = uint64(api / sec)
		out.serverRunQueue = time.Duration(serverRQ / sec)
		out.benchRunQueue = time.Duration(benchRQ / sec)
		out.levelLimit = limit / sec
	}
	if limit > 0 {
		out.levelLingering = lingering / limit
	}
	out.nodeP50, out.nodeP99 = out.node.quantile(0.5), out.node.quantile(0.99)
	out.getP50, out.getP99 = out.workload.quantile(0.5), out.workload.quantile(0.99)
	return out
}

func writeFloodRow(w io.Writer, server string, ph, base *floodPhase) {
	ratio := func(a, b time.Duration) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", float64(a)/float64(b))
	}
	fl := ph.flooder
	share, ra := "-", "-"
	if n := fl.OK + fl.TooMany + fl.S5x + fl.Other + fl.Dropped; n > 0 {
		share = fmt.Sprintf("%.1f%%", 100*float64(fl.TooMany)/float64(n))
	}
	if fl.TooMany > 0 {
		ra = fmt.Sprintf("%d/%d", fl.WithRetryAfter, fl.TooMany)
	}
	victimsFailed := ph.node.TooMany + ph.node.S5x + ph.node.Other + ph.node.Dropped + ph.workload.TooMany + ph.workload.S5x + ph.workload.Other + ph.workload.Dropped
	handler := "-"
	if ph.handlerP99 > 0 {
		handler = fmt.Sprintf("<= %g", ph.handlerP99*1000)
	}
	level := "-"
	if ph.levelLimit > 0 {
		level = fmt.Sprintf("%.0f (%.0f%%)", ph.levelLimit, 100*ph.levelLingering)
	}
	seatCPU := "-"
	switch {
	case ph.shardSeatCPU > 0:
		seatCPU = fmt.Sprintf("%.0f + %.0f", ph.seatCPU*1e6, ph.shardSeatCPU*1e6)
	case ph.seatCPU > 0:
		seatCPU = fmt.Sprintf("%.0f", ph.seatCPU*1e6)
	}
	fmt.Fprintf(w, "%s\t%s\t%.1f\t%.1f\t%s\t%.1f\t%.1f\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%.2f\t%s\t%.0f\t%.0f\t%.2f\t%s\t%s\t\n",
		server, ph.name, ms(ph.nodeP50), ms(ph.nodeP99), ratio(ph.nodeP99, base.nodeP99), ms(ph.getP50), ms(ph.getP99), ratio(ph.getP99, base.getP99),
		victimsFailed, fl.OK, fl.TooMany, share, ra,
		fl.S5x+ph.node.S5x+ph.workload.S5x, fl.Dropped+ph.node.Dropped+ph.workload.Dropped+int(ph.watchDrops),
		ph.peakRSS>>20, float64(ph.cpuMilliCores)/1000, handler, ms(ph.serverRunQueue), ms(ph.benchRunQueue), float64(ph.apiMilliCores)/1000, level, seatCPU)
}

// floodUsers makes the three identities and lets every authenticated user
// read ConfigMaps and Pods, and go through the aggregated paths of the
// tiers' groups (what the operator's per-profile reader ClusterRole grants;
// the tier then authorizes the read itself).
func floodUsers(ctx context.Context, env *benchEnv, tierGroups ...string) (floodIdentities, error) {
	rbac := env.kc.RbacV1()
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, Verbs: []string{"get", "list", "watch"}}}
	if len(tierGroups) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: tierGroups, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}})
	}
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flood-reader"}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		return floodIdentities{}, err
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flood-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flood-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}}, metav1.CreateOptions{}); err != nil {
		return floodIdentities{}, err
	}
	var ids floodIdentities
	var err error
	if ids.flooder, err = env.cp.UserKubeconfig("flooder"); err != nil {
		return ids, err
	}
	if ids.node, err = env.cp.UserKubeconfig("system:node:"+benchNodeName(7), "system:nodes"); err != nil {
		return ids, err
	}
	ids.workload, err = env.cp.UserKubeconfig("system:serviceaccount:flood-pods:app", "system:serviceaccounts", "system:serviceaccounts:flood-pods")
	return ids, err
}

// tierAdmin is admin's identity (the cluster CA's admin certificate, which
// the tier trusts) at a tier's own address.
func tierAdmin(admin *rest.Config, t floodTarget) *rest.Config {
	c := rest.CopyConfig(admin)
	c.Host, c.CAData, c.CAFile, c.ServerName = t.Host, t.CA, "", t.ServerName
	return c
}

// profileFloodPhase, with -profile-dir, takes a 10-second CPU profile of
// the server reached (the tier's process, or the front of a fleet; the
// apiserver for its own rows) from 10 s into a flood phase:
// flood-<server>-<phase>.pprof. Where the server's CPU goes while the
// victims wait. The returned func waits for it.
func profileFloodPhase(s floodServer, phase, dir string, d time.Duration) func() error {
	if dir == "" || phase == "" || s.admin == nil || d < 25*time.Second {
		return func() error { return nil }
	}
	file := filepath.Join(dir, fmt.Sprintf("flood-%s-%s.pprof", s.key, phase))
	done := make(chan error, 1)
	go func() {
		time.Sleep(10 * time.Second)
		err := saveCPUProfile(s.admin, file)
		if err == nil {
			fmt.Fprintf(os.Stderr, "bench: wrote %s\n", file)
		}
		done <- err
	}()
	return func() error { return <-done }
}

// tierNodeListBuckets reads the tier's cachetier_request_duration_seconds
// buckets of pods LISTs (in a flood only the node's: the flooder reads
// ConfigMaps) from its /metrics: upper bound -> cumulative count. The
// handler's time starts after authentication and priority and fairness
// and ends with the last byte handed to the connection, so next to the
// node's own p99 it says how much of the victim's wait was the tier's
// handling and how much was waiting for the machine's cores, TLS, the
// flow control and the client. Nil for the apiserver.
func tierNodeListBuckets(s floodServer) map[float64]float64 {
	if s.admin == nil || s.key == "apiserver" {
		return nil
	}
	body, err := getOK(s.admin, "/metrics")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return nil
	}
	buckets := map[float64]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		name, labels, n, ok := metricLine(line)
		if !ok || name != "cachetier_request_duration_seconds_bucket" || !strings.Contains(labels, `verb="list"`) || !strings.Contains(labels, "pods") {
			continue
		}
		_, le, found := strings.Cut(labels, `le="`)
		if !found {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		if bound, err := strconv.ParseFloat(le, 64); err == nil {
			buckets[bound] += n
		}
	}
	return buckets
}

// bucketQuantile is the upper bound of the bucket holding quantile q of
// the observations made between two readings of a histogram's cumulative
// buckets (+Inf when it lies beyond the last finite bound); 0 without
// observations.
func bucketQuantile(before, after map[float64]float64, q float64) float64 {
	if after == nil {
		return 0
	}
	bounds := slices.Sorted(maps.Keys(after))
	if len(bounds) == 0 {
		return 0
	}
	total := after[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return 0
	}
	for _, b := range bounds {
		if after[b]-before[b] >= q*total {
			return b
		}
	}
	return bounds[len(bounds)-1]
}

package main

// -mode nodes (issue 20): node-scoped reads and watches, tier vs
// kube-apiserver, on the same data in one run.
//
// P Pods (-node-pods, Deployment-like, -pod-size bytes of JSON) are created
// bound round-robin to N nodes (-nodes; no Node objects, no kubelet). W
// watchers act as kubelets do: each LISTs the Pods of its node
// (fieldSelector=spec.nodeName=<node>, resourceVersion=0), then WATCHes
// from that list's RV with allowWatchBookmarks; watcher i has node i mod N.
// A writer patches the Pods at -node-updates per second for -node-duration,
// round-robin so consecutive updates hit consecutive nodes, each patch
// stamping the time it is sent (delivery.go); watchers record receive time
// − stamp.
//
// Phases, in order (each a run of the same writer):
//
//  1. the writer alone (no tier, no watchers): the apiserver's CPU per
//     update for the write itself;
//  2. the apiserver: LIST by node (sequential, random nodes) and, for each
//     W, W watchers on the apiserver;
//  3. for each tier (-node-tiers: the standalone tier's direct endpoint,
//     and a fleet of -fleet shards, default 2, through its front): LIST by
//     node, then W = 0 (the tier connected, nothing watching it: its
//     ingestion) and each W, the watchers on the tier;
//  4. the writer alone again (drift: the figure used is the mean).
//
// The CPU of a phase is taken over the writer's run and writeTail after
// it. Per update: the apiserver's dispatch is what its CPU profile over
// the same window spends serving watches (dispatchcpu.go); the tier's
// cost is its processes' CPU per update plus what the apiserver's profile
// spends serving the tier's ingestion watch the same way. The older
// measure, the apiserver's CPU per update in the phase minus the
// writer-alone figure, is printed beside it. After each phase, when no more
// events come, every watcher's view of its node (name → resourceVersion,
// from its LIST and events) is compared with a LIST of that node from the
// apiserver: missing and extra objects and RV mismatches must be 0.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

type nodesOptions struct {
	pods, nodes int
	watchers    string
	rate        int
	duration    time.Duration
	lists       int
	tiers       string
	drain       time.Duration
	openers     int
	openTimeout time.Duration
	// writers is -writers (watch.go): the writer's goroutines.
	writers int
	// podSize is -pod-size.
	podSize int
	// profileDir is -profile-dir: each phase's servers are CPU-profiled
	// during its writer's run (profileNodePhase).
	profileDir string
	// dispatchProfile is -node-dispatch-profile: the apiserver is
	// profiled in every phase for its dispatch (dispatchcpu.go).
	dispatchProfile bool
}

func nodesFlags() *nodesOptions {
	var n nodesOptions
	flag.IntVar(&n.pods, "node-pods", 10000, "nodes: Pods, bound round-robin to -nodes nodes")
	flag.IntVar(&n.nodes, "nodes", 500, "nodes: nodes the Pods are bound to")
	flag.StringVar(&n.watchers, "node-watchers", "", "nodes: comma-separated numbers of node-scoped watchers to run, one phase each (default 1,<nodes>,2000)")
	flag.IntVar(&n.rate, "node-updates", 100, "nodes: Pod updates per second")
	flag.DurationVar(&n.duration, "node-duration", 20*time.Second, "nodes: how long the writer runs in each phase")
	flag.IntVar(&n.lists, "node-lists", 100, "nodes: sequential LISTs by node (resourceVersion=0, random nodes) per server")
	flag.StringVar(&n.tiers, "node-tiers", "standalone,fleet", "nodes: the tiers to measure: standalone (direct endpoint) and/or fleet (-fleet shards, default 2, through the front)")
	flag.DurationVar(&n.drain, "node-drain", 15*time.Second, "nodes: after the writer stops, wait at most this long for the watchers' last events")
	flag.IntVar(&n.openers, "node-openers", 32, "nodes: watchers opening (LIST, then WATCH) at once")
	flag.DurationVar(&n.openTimeout, "node-open-timeout", 30*time.Minute, "nodes: give up (and fail) when the W watchers of a phase are not all open after this long")
	flag.BoolVar(&n.dispatchProfile, "node-dispatch-profile", true, "nodes: read the apiserver's dispatch from its CPU profile in every phase (false: no profile, the dispatch rows n/a; the profiling changes the latencies measured)")
	return &n
}

// watcherCounts parses -node-watchers.
func (n *nodesOptions) watcherCounts() ([]int, error) {
	s := n.watchers
	if s == "" {
		s = fmt.Sprintf("1,%d,2000", n.nodes)
	}
	counts, err := parseCounts(s)
	if err != nil {
		return nil, err
	}
	slices.Sort(counts)
	counts = slices.Compact(counts)
	if slices.Contains(counts, 0) {
		return nil, fmt.Errorf("-node-watchers: 0 is measured for every tier anyway")
	}
	return counts, nil
}

// nodeTarget is a server the watchers and LISTs go to.
type nodeTarget struct {
	name string
	cfg  *rest.Config
	// pids are the server's processes; tier is false for the apiserver.
	pids []int
	tier bool
	// metrics are the tier's /metrics URLs (every process that holds
	// objects), read with metricsClient.
	metrics       []string
	metricsClient *http.Client
	// alive reports a process that exited, with its last log lines.
	alive func() error
	// parts are a fleet's shards (profiled with the front).
	parts []profTarget
}

// podWriter patches the data set's Pods round-robin and counts the
// successful writes per node.
type podWriter struct {
	env    *benchEnv
	ns     string
	pods   []string
	nodes  int
	byNode []atomic.Int64
}

func (w *podWriter) reset() {
	for i := range w.byNode {
		w.byNode[i].Store(0)
	}
}

func (w *podWriter) write(ctx context.Context, i int) error {
	k := i % len(w.pods)
	_, err := w.env.kc.CoreV1().Pods(w.ns).Patch(ctx, w.pods[k], types.MergePatchType, stampPatch(), metav1.PatchOptions{})
	if err == nil {
		w.byNode[k%w.nodes].Add(1)
	}
	return err
}

// nodeWatcher is one kubelet-like watcher: its view of its node's Pods.
type nodeWatcher struct {
	node  string
	index int // the node's number
	// objs (name → resourceVersion) is written by the watcher's goroutine
	// only and read once it has ended.
	objs map[string]string
	// timed counts the events stamped by the current phase's writer (read
	// by the drain loop while the watcher runs); replayed those stamped
	// before it (a watch that started behind).
	timed, replayed atomic.Int64
	hist            latencyCounts
	// listMs and watchMs are how long its LIST and the opening of its
	// WATCH (until the response headers) took.
	listMs, watchMs float64
	err             error
}

// nodeListURL is the LIST (or, with watch, WATCH) of one node's Pods.
func nodeListURL(host, ns, node string, extra url.Values) string {
	q := url.Values{"fieldSelector": {"spec.nodeName=" + node}}
	for k, v := range extra {
		q[k] = v
	}
	return host + "/api/v1/namespaces/" + ns + "/pods?" + q.Encode()
}

// podList is what the bench reads of a LIST of Pods.
type podList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	} `json:"items"`
}

func getPodList(ctx context.Context, c *http.Client, u string) (*podList, error) {
	var l podList
	if err := getJSON(ctx, c, u, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// run LISTs the watcher's node, then watches it from the list's RV until
// ctx ends (nil) or the stream breaks (the error). opened is called once
// the watch is established (or failed to be); both must happen by openBy.
func (w *nodeWatcher) run(ctx context.Context, c *http.Client, host, ns string, since int64, openBy time.Time, opened func(error)) error {
	t0 := time.Now()
	listCtx, cancelList := context.WithDeadline(ctx, openBy)
	l, err := getPodList(listCtx, c, nodeListURL(host, ns, w.node, url.Values{"resourceVersion": {"0"}}))
	cancelList()
	if err != nil {
		opened(err)
		return err
	}
	w.listMs = ms(time.Since(t0))
	w.objs = make(map[string]string, len(l.Items))
	for _, it := range l.Items {
		w.objs[it.Metadata.Name] = it.Metadata.ResourceVersion
	}
	// The watch outlives openBy; only its opening is bounded.
	watchCtx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	late := time.AfterFunc(time.Until(openBy), cancelWatch)
	t1 := time.Now()
	resp, err := openGet(watchCtx, c, nodeListURL(host, ns, w.node, url.Values{"watch": {"1"}, "resourceVersion": {l.Metadata.ResourceVersion}, "allowWatchBookmarks": {"true"}}))
	if !late.Stop() && err == nil {
		resp.Body.Close()
		err = fmt.Errorf("watch %s: not open by the deadline", w.node)
	}
	if err != nil {
		opened(err)
		return err
	}
	w.watchMs = ms(time.Since(t1))
	defer resp.Body.Close()
	opened(nil)
	events := newEventReader(resp.Body)
	for {
		ev, err := events.next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		now := time.Now()
		if err := errorEvent(ev); err != nil {
			return err
		}
		var e struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Name            string `json:"name"`
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := json.Unmarshal(ev, &e); err != nil {
			return fmt.Errorf("watch %s: undecodable event: %v", w.node, err)
		}
		switch e.Type {
		case "ADDED", "MODIFIED":
			w.objs[e.Object.Metadata.Name] = e.Object.Metadata.ResourceVersion
		case "DELETED":
			delete(w.objs, e.Object.Metadata.Name)
		}
		if ts, ok := stampOf(ev); ok && e.Type == "MODIFIED" {
			if ts < since {
				w.replayed.Add(1)
				continue
			}
			w.hist.record(now, ts)
			w.timed.Add(1)
		}
	}
}

// nodePhase is one run of the writer and what the watchers saw.
type nodePhase struct {
	watchers int
	// start is when the writer started.
	start    time.Time
	w        writeResult
	window   time.Duration
	serverMs float64 // the tier's processes' CPU over the window
	apiMs    float64 // the apiserver's
	// apiProf is the apiserver's CPU profile over the writer's run, split
	// into watch serving and connection writes (dispatchcpu.go).
	apiProf     cpuSplit
	established int
	// openLat and watchLat are the watchers' LISTs and WATCH openings
	// (-node-openers at once); openTime is how long all W took to open.
	openLat, watchLat []float64
	openTime          time.Duration
	lat               latencies
	expected          int64
	delivered         int64
	replayed          int64
	ended             int
	firstErr          error
	// missing, extra and mismatched compare every watcher's view with the
	// apiserver's LIST of its node.
	missing, extra, mismatched int
	// upstream is the tier's requests to the apiserver during the phase.
	upstream string
}

func (p nodePhase) perUpdate(msCPU float64) float64 {
	if p.w.writes == 0 {
		return math.NaN()
	}
	return msCPU / float64(p.w.writes)
}

// runNodePhase opens w watchers on t (none when t is nil: the writer
// alone), runs the writer, drains, and checks every watcher against the
// apiserver.
func runNodePhase(ctx context.Context, env *benchEnv, t *nodeTarget, writer *podWriter, w int, no *nodesOptions) (nodePhase, error) {
	ph := nodePhase{watchers: w}
	if t != nil && t.alive != nil {
		if err := t.alive(); err != nil {
			return ph, err
		}
	}
	if err := env.cp.Exited(); err != nil {
		return ph, err
	}
	since := time.Now().UnixNano()
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	var watchers []*nodeWatcher
	var wg sync.WaitGroup
	if w > 0 {
		clients, err := fanoutTransports(t.cfg, max(w/250, 4))
		if err != nil {
			return ph, err
		}
		sem := make(chan struct{}, max(no.openers, 1))
		var established, failed atomic.Int64
		var errMu sync.Mutex
		var firstErr error
		openStart := time.Now()
		openBy := openStart.Add(no.openTimeout)
		for i := range w {
			if time.Now().After(openBy) {
				break
			}
			nw := &nodeWatcher{node: benchNodeName(i % no.nodes), index: i % no.nodes}
			watchers = append(watchers, nw)
			sem <- struct{}{}
			wg.Add(1)
			go func(c *http.Client) {
				defer wg.Done()
				once := sync.OnceFunc(func() { <-sem })
				defer once()
				nw.err = nw.run(watchCtx, c, t.cfg.Host, writer.ns, since, openBy, func(err error) {
					if err != nil {
						failed.Add(1)
						errMu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						errMu.Unlock()
					} else {
						established.Add(1)
					}
					once()
				})
			}(clients[i%len(clients)])
			if failed.Load() > 0 {
				break
			}
		}
		for established.Load()+failed.Load() < int64(len(watchers)) && time.Now().Before(openBy) {
			time.Sleep(50 * time.Millisecond)
		}
		ph.established = int(established.Load())
		if ph.established < w {
			stop()
			wg.Wait()
			errMu.Lock()
			err := firstErr
			errMu.Unlock()
			if err == nil {
				err = fmt.Errorf("not all open after -node-open-timeout %s", no.openTimeout)
			}
			return ph, fmt.Errorf("%s: %d of %d watchers established: %w%s", t.name, ph.established, w, err, aliveNote(t))
		}
		for _, nw := range watchers {
			ph.openLat = append(ph.openLat, nw.listMs)
			ph.watchLat = append(ph.watchLat, nw.watchMs)
		}
		ph.openTime = time.Since(openStart)
		time.Sleep(time.Second)
	}
	writer.reset()
	var pids []int
	var before map[string]float64
	if t != nil && t.tier {
		pids = t.pids
		before = upstreamCounters(t.metricsClient, t.metrics)
	}
	s0, a0, start := cpuTicksAll(pids), cpuTicks(env.apiPID), time.Now()
	ph.start = start
	profiled := profileNodePhase(env, t, w, no)
	ph.w = writeLoop(ctx, no.rate, no.duration, no.writers, writer.write)
	time.Sleep(writeTail)
	apiProf, err := profiled()
	if err != nil {
		return ph, err
	}
	ph.apiProf = apiProf
	ph.serverMs, ph.apiMs, ph.window = ticksMs(cpuTicksAll(pids)-s0), ticksMs(cpuTicks(env.apiPID)-a0), time.Since(start)
	if before != nil {
		if ph.upstream = counterDelta(before, upstreamCounters(t.metricsClient, t.metrics), float64(max(ph.w.writes, 1))/1000); ph.upstream == "" {
			ph.upstream = "none"
		}
	}
	if w == 0 {
		return ph, nil
	}

	// Drain: until every watcher has every update of its node, nothing
	// arrived for 3 s, or -node-drain passed.
	expected := func(nw *nodeWatcher) int64 { return writer.byNode[nw.index].Load() }
	drainUntil(no.drain, 3*time.Second, func() (got, want int64) {
		for _, nw := range watchers {
			got += min(nw.timed.Load(), expected(nw))
			want += expected(nw)
		}
		return got, want
	})
	stop()
	wg.Wait()
	for _, nw := range watchers {
		ph.expected += expected(nw)
		ph.delivered += nw.timed.Load()
		ph.replayed += nw.replayed.Load()
		ph.lat.add(&nw.hist)
		if nw.err != nil {
			ph.ended++
			if ph.firstErr == nil {
				ph.firstErr = nw.err
			}
		}
	}
	if err := verifyNodeViews(ctx, env, writer.ns, watchers, &ph); err != nil {
		return ph, err
	}
	return ph, nil
}

// profileNodePhase profiles the apiserver's CPU over the phase's writer
// run and writeTail after it (unless -node-dispatch-profile=false): its
// split (dispatchcpu.go) is the apiserver's dispatch. Every phase, the
// writer alone too, is profiled the same way, so the sampling's cost is in
// every figure alike — but it is not nothing: with the apiserver profiled
// its delivery p99 came out lower (see docs/benchmarks.md). With
// -profile-dir the profile is kept (nodes-<server>-W<w>-apiserver.pprof,
// nodes-alone-<hhmmss>-apiserver.pprof) and a tier's processes get
// 10-second profiles from 2 s into the run (-tier.pprof,
// -tier-<part>.pprof): where their CPU per update goes. The returned func
// waits for the profiles.
func profileNodePhase(env *benchEnv, t *nodeTarget, w int, no *nodesOptions) func() (cpuSplit, error) {
	slug := func(s string) string {
		s = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '-'
		}, strings.ToLower(s))
		for strings.Contains(s, "--") {
			s = strings.ReplaceAll(s, "--", "-")
		}
		return strings.Trim(s, "-")
	}
	var base string
	if no.profileDir != "" {
		if t == nil {
			base = filepath.Join(no.profileDir, fmt.Sprintf("nodes-alone-%s", time.Now().UTC().Format("150405")))
		} else {
			base = filepath.Join(no.profileDir, fmt.Sprintf("nodes-%s-W%d", slug(t.name), w))
		}
	}
	type result struct {
		split cpuSplit
		err   error
	}
	api := make(chan result, 1)
	go func() {
		if !no.dispatchProfile && base == "" {
			api <- result{} // -node-dispatch-profile=false: not profiled
			return
		}
		file := ""
		if base != "" {
			file = base + "-apiserver.pprof"
		}
		split, err := profileAPIServer(env.admin, no.duration+writeTail, file)
		api <- result{split, err}
	}()
	var targets []profTarget
	if base != "" && t != nil && t.tier && no.duration >= 12*time.Second {
		targets = append(targets, profTarget{"tier", t.cfg})
		for _, p := range t.parts {
			targets = append(targets, profTarget{"tier-" + p.name, p.cfg})
		}
	}
	errs := make(chan error, len(targets))
	for _, pt := range targets {
		go func() {
			time.Sleep(2 * time.Second)
			file := base + "-" + pt.name + ".pprof"
			err := saveCPUProfile(pt.cfg, file)
			if err == nil {
				fmt.Fprintf(os.Stderr, "bench: wrote %s\n", file)
			}
			errs <- err
		}()
	}
	return func() (cpuSplit, error) {
		r := <-api
		first := r.err
		for range targets {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return r.split, first
	}
}

// aliveNote is the last log lines of a tier process that exited, if one
// did.
func aliveNote(t *nodeTarget) string {
	if t == nil || t.alive == nil {
		return ""
	}
	if err := t.alive(); err != nil {
		return "; " + err.Error()
	}
	return ""
}

// verifyNodeViews compares every watcher's view with a consistent LIST of
// its node from the apiserver.
func verifyNodeViews(ctx context.Context, env *benchEnv, ns string, watchers []*nodeWatcher, ph *nodePhase) error {
	c, err := rest.HTTPClientFor(env.admin)
	if err != nil {
		return err
	}
	byNode := map[string][]*nodeWatcher{}
	var nodes []string
	for _, nw := range watchers {
		if byNode[nw.node] == nil {
			nodes = append(nodes, nw.node)
		}
		byNode[nw.node] = append(byNode[nw.node], nw)
	}
	var mu sync.Mutex
	return parallel(len(nodes), 8, func(i int) error {
		l, err := getPodList(ctx, c, nodeListURL(env.admin.Host, ns, nodes[i], nil))
		if err != nil {
			return err
		}
		want := make(map[string]string, len(l.Items))
		for _, it := range l.Items {
			want[it.Metadata.Name] = it.Metadata.ResourceVersion
		}
		mu.Lock()
		defer mu.Unlock()
		for _, nw := range byNode[nodes[i]] {
			for name, rv := range want {
				got, ok := nw.objs[name]
				switch {
				case !ok:
					ph.missing++
				case got != rv:
					ph.mismatched++
				}
			}
			for name := range nw.objs {
				if _, ok := want[name]; !ok {
					ph.extra++
				}
			}
		}
		return nil
	})
}

// nodeLists is the cost of LISTs by node on one server.
type nodeLists struct {
	p50, p99 float64
	// server is the serving processes' CPU per LIST (the apiserver's above
	// idle when it serves them); caused, for a tier, the apiserver's CPU
	// per LIST above idle; whole the sum.
	server, caused, whole float64
}

func measureNodeLists(env *benchEnv, t *nodeTarget, ns string, no *nodesOptions, settle time.Duration) (nodeLists, error) {
	c, err := rest.HTTPClientFor(t.cfg)
	if err != nil {
		return nodeLists{}, err
	}
	read := func() error {
		_, err := getPodList(context.Background(), c, nodeListURL(t.cfg.Host, ns, benchNodeName(rand.IntN(no.nodes)), url.Values{"resourceVersion": {"0"}}))
		return err
	}
	var server []int
	if t.tier {
		server = t.pids
	}
	cost, err := measureCalls(env.apiPID, server, no.lists, settle, read, nil)
	if err != nil {
		return nodeLists{}, fmt.Errorf("%s: LIST by node: %w%s", t.name, err, aliveNote(t))
	}
	r := nodeLists{p50: pct(cost.lat, 50), p99: pct(cost.lat, 99)}
	if t.tier {
		r.server, r.caused, r.whole = cost.server, cost.api, cost.server+cost.api
	} else {
		r.server, r.caused, r.whole = cost.api, math.NaN(), cost.api
	}
	return r, nil
}

// indexShare reads the tier's index size and cached bytes from /metrics:
// the bytes of every cachetier_*index*_bytes series (the field index's
// size, when the tier exports one), and cachetier_shard_bytes for pods.
func indexShare(t *nodeTarget) (index, cached float64, names []string) {
	index = math.NaN()
	for _, line := range scrapeMetrics(t.metricsClient, t.metrics) {
		name, rest, _ := strings.Cut(line, "{")
		if !strings.Contains(line, "{") {
			name, rest, _ = strings.Cut(line, " ")
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		podsOrAll := !strings.Contains(rest, "resource=") || strings.Contains(rest, `resource="pods"`)
		switch {
		case name == "cachetier_shard_bytes" && podsOrAll:
			cached += v
		case strings.HasPrefix(name, "cachetier_") && strings.Contains(name, "index") && strings.HasSuffix(name, "_bytes") && podsOrAll:
			if math.IsNaN(index) {
				index = 0
			}
			index += v
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	return index, cached, names
}

// startNodeTier starts one of the tiers of -node-tiers caching the data
// set's Pods.
func startNodeTier(ctx context.Context, env *benchEnv, o options, kind string) (*nodeTarget, func(), error) {
	shards := 0
	switch kind {
	case "standalone":
	case "fleet":
		shards = max(o.fleet, 2)
	default:
		return nil, nil, fmt.Errorf("-node-tiers: unknown tier %q (standalone, fleet)", kind)
	}
	start := time.Now()
	tp, err := startTier(ctx, env.cp, env.admin, o.binary, o.tierFlags, o.tierEnv, "nodes", "pods", shards, o.freshness)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", kind, err)
	}
	name := "standalone (direct)"
	if shards > 0 {
		name = fmt.Sprintf("fleet (%d shards, front)", shards)
	}
	fmt.Fprintf(os.Stderr, "bench: %s ready in %s\n", name, time.Since(start).Round(time.Millisecond))
	mc, err := rest.HTTPClientFor(tp.cfg)
	if err != nil {
		tp.stop()
		return nil, nil, err
	}
	t := &nodeTarget{name: name, cfg: tp.cfg, pids: tp.pids, tier: true, metricsClient: mc, alive: tp.alive, parts: tp.parts}
	if len(tp.parts) == 0 {
		t.metrics = []string{tp.cfg.Host + "/metrics"}
	}
	for _, p := range tp.parts {
		t.metrics = append(t.metrics, p.cfg.Host+"/metrics")
	}
	return t, tp.stop, nil
}

// nodeTierResult is one tier's measurements.
type nodeTierResult struct {
	t             *nodeTarget
	lists         nodeLists
	phases        map[int]nodePhase // by W; 0 is the tier with nothing watching
	index, cached float64
	indexNames    []string
}

func runNodes(ctx context.Context, o options, no *nodesOptions) error {
	counts, err := no.watcherCounts()
	if err != nil {
		return err
	}
	if no.nodes < 1 || no.pods < no.nodes {
		return fmt.Errorf("-nodes %d, -node-pods %d: need 1 <= nodes <= pods", no.nodes, no.pods)
	}
	if err := raiseNoFile(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: raising RLIMIT_NOFILE:", err)
	}
	no.profileDir = o.profileDir
	o.apiProfiling = no.dispatchProfile // the apiserver's dispatch (dispatchcpu.go)
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	fmt.Fprintf(os.Stderr, "bench: load average at start %s\n", loadAvg())

	d := dataset{name: "nodes", resource: "pods", count: no.pods, size: no.podSize, nodes: no.nodes}
	ns := "bench-" + d.name
	start := time.Now()
	jsonBytes, err := seed(ctx, env.kc, ns, d, o.concurrency)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: seeded %d Pods (%.0f B of JSON each) on %d nodes in %s\n", d.count, float64(jsonBytes)/float64(d.count), no.nodes, time.Since(start).Round(time.Second))
	writer := &podWriter{env: env, ns: ns, nodes: no.nodes, byNode: make([]atomic.Int64, no.nodes)}
	for i := range no.pods {
		writer.pods = append(writer.pods, benchPodName(i))
	}
	// The writer alone runs before each server's phases and at the end;
	// each phase is compared with the runs on either side of it
	// (baselines.at: the apiserver's CPU per write drifts over a long run).
	// aloneServing is the same runs' watch serving and connection writes
	// per write, from the apiserver's profile (dispatchcpu.go): the
	// control plane's own watchers of Pods and the writer's responses.
	var alone, aloneServing baselines
	runAlone := func() error {
		fmt.Fprintf(os.Stderr, "bench: the writer alone, %d updates/s for %s\n", no.rate, no.duration)
		ph, err := runNodePhase(ctx, env, nil, writer, 0, no)
		if err != nil {
			return err
		}
		if ph.w.writes == 0 {
			return fmt.Errorf("writer alone: no write succeeded (%d failed)", ph.w.failed)
		}
		alone = append(alone, baseline{ph.start, ph.perUpdate(ph.apiMs)})
		fmt.Fprintf(os.Stderr, "bench: the writer alone: %d writes; apiserver CPU %.0f ms (profile: %.0f ms, watch serving %.0f, connection writes %.0f)\n",
			ph.w.writes, ph.apiMs, ph.apiProf.total, ph.apiProf.watch, ph.apiProf.conn)
		serving := math.NaN()
		if ph.apiProf.ok {
			serving = ph.perUpdate(ph.apiProf.watch + ph.apiProf.conn)
		}
		aloneServing = append(aloneServing, baseline{ph.start, serving})
		return nil
	}
	if err := runAlone(); err != nil {
		return err
	}

	api := &nodeTarget{name: "kube-apiserver", cfg: env.admin, pids: []int{env.apiPID}}
	apiLists, err := measureNodeLists(env, api, ns, no, 0)
	if err != nil {
		return err
	}
	apiPhases := map[int]nodePhase{}
	for _, w := range counts {
		fmt.Fprintf(os.Stderr, "bench: %d watchers on the apiserver\n", w)
		if apiPhases[w], err = runNodePhase(ctx, env, api, writer, w, no); err != nil {
			return err
		}
		reportPhase(api.name, apiPhases[w])
	}

	var tiers []nodeTierResult
	for _, kind := range strings.Split(no.tiers, ",") {
		if err := runAlone(); err != nil {
			return err
		}
		t, stop, err := startNodeTier(ctx, env, o, strings.TrimSpace(kind))
		if err != nil {
			return err
		}
		r := nodeTierResult{t: t, phases: map[int]nodePhase{}}
		if r.lists, err = measureNodeLists(env, t, ns, no, o.settle); err != nil {
			stop()
			return err
		}
		for _, w := range append([]int{0}, counts...) {
			fmt.Fprintf(os.Stderr, "bench: %d watchers on %s\n", w, t.name)
			ph, err := runNodePhase(ctx, env, t, writer, w, no)
			if err != nil {
				stop()
				return err
			}
			r.phases[w] = ph
			reportPhase(t.name, ph)
		}
		// The tier publishes its store's sizes every 5 s: read them once
		// it has long been loaded.
		r.index, r.cached, r.indexNames = indexShare(t)
		stop()
		tiers = append(tiers, r)
	}
	if err := runAlone(); err != nil {
		return err
	}
	printNodes(os.Stdout, nodesReport{
		o: no, podSize: float64(jsonBytes) / float64(d.count), counts: counts, alone: alone, aloneServing: aloneServing,
		apiLists: apiLists, apiPhases: apiPhases, tiers: tiers,
	})
	return nil
}

// reportPhase logs a phase's figures as it ends.
func reportPhase(server string, ph nodePhase) {
	fmt.Fprintf(os.Stderr, "bench: %s, %d watchers: %d writes (%d dropped, %d failed) in %s; CPU server %.0f ms, apiserver %.0f ms (profile: %.0f ms, watch serving %.0f, connection writes %.0f); delivered %d/%d (replayed %d), p50 %s p99 %s; opening %s (LIST p50 %.1f ms, WATCH p50 %.1f ms); missing %d extra %d RV mismatches %d; ended early %d %v; requests to the apiserver per 1000 updates: %s\n",
		server, ph.watchers, ph.w.writes, ph.w.dropped, ph.w.failed, ph.window.Round(time.Millisecond), ph.serverMs, ph.apiMs, ph.apiProf.total, ph.apiProf.watch, ph.apiProf.conn,
		ph.delivered, ph.expected, ph.replayed, ph.lat.quantile(0.5), ph.lat.quantile(0.99), ph.openTime.Round(time.Millisecond), pct(ph.openLat, 50), pct(ph.watchLat, 50),
		ph.missing, ph.extra, ph.mismatched, ph.ended, ph.firstErr, ph.upstream)
}

// baseline is a run of the writer alone: when it started and the
// apiserver's CPU per write.
type baseline struct {
	start    time.Time
	perWrite float64
}

type baselines []baseline

// at is the apiserver's CPU per write with nothing watching at t,
// interpolated between the writer-alone runs before and after t.
func (b baselines) at(t time.Time) float64 {
	if len(b) == 0 {
		return math.NaN()
	}
	if !t.After(b[0].start) {
		return b[0].perWrite
	}
	for i := 1; i < len(b); i++ {
		if t.Before(b[i].start) {
			f := t.Sub(b[i-1].start).Seconds() / b[i].start.Sub(b[i-1].start).Seconds()
			return b[i-1].perWrite + f*(b[i].perWrite-b[i-1].perWrite)
		}
	}
	return b[len(b)-1].perWrite
}

type nodesReport struct {
	o       *nodesOptions
	podSize float64
	counts  []int
	alone   baselines
	// aloneServing: the writer-alone runs' watch serving and connection
	// writes per write (the apiserver's profile).
	aloneServing baselines
	apiLists     nodeLists
	// apiPhases are the apiserver's, by W.
	apiPhases map[int]nodePhase
	tiers     []nodeTierResult
}

// profiled is the apiserver's CPU per update serving watches in a phase,
// from its profile: watch serving and connection writes, above the
// writer-alone runs' (NaN without a profile).
func (r nodesReport) profiled(ph nodePhase) float64 {
	if !ph.apiProf.ok {
		return math.NaN()
	}
	return ph.perUpdate(ph.apiProf.watch+ph.apiProf.conn) - r.aloneServing.at(ph.start)
}

// verdict is "<= bound met" or "<= bound NOT MET" for a ratio.
func verdict(ratio, bound float64) string {
	switch {
	case math.IsNaN(ratio) || math.IsInf(ratio, 0):
		return fmt.Sprintf("<= %g n/a", bound)
	case ratio <= bound:
		return fmt.Sprintf("<= %g met", bound)
	}
	return fmt.Sprintf("<= %g NOT MET", bound)
}

func ratioOf(tier, api float64) float64 {
	if api <= 0 || math.IsNaN(api) || math.IsNaN(tier) {
		return math.NaN()
	}
	return tier / api
}

func printNodes(w io.Writer, r nodesReport) {
	nan := math.NaN()
	msd := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	var rows []row
	var notes []string
	a := r.apiLists
	for _, tr := range r.tiers {
		label := fmt.Sprintf("%s, %d Pods on %d nodes", tr.t.name, r.o.pods, r.o.nodes)
		l := tr.lists
		rows = append(rows,
			row{label, "LIST by node (RV=0) p50", "ms", a.p50, l.p50, verdict(ratioOf(l.p50, a.p50), 1)},
			row{label, "LIST by node (RV=0) p99", "ms", a.p99, l.p99, ""},
			row{label, "CPU per LIST by node (apiserver: above idle)", "ms", a.server, l.server, ""},
			row{label, "apiserver CPU per tier LIST by node (above idle)", "ms", nan, l.caused, ""},
			row{label, "whole CPU per LIST by node", "ms", a.whole, l.whole, ""},
		)
		if ph, ok := tr.phases[0]; ok {
			rows = append(rows,
				row{label, "W=0 (tier connected, nothing watching it): tier CPU per update (ingestion)", "ms", nan, ph.perUpdate(ph.serverMs), ""},
				row{label, "W=0: apiserver CPU per update the tier causes (its profile)", "ms", nan, r.profiled(ph), ""},
				row{label, "W=0: the same from the apiserver's process totals", "ms", nan, ph.perUpdate(ph.apiMs) - r.alone.at(ph.start), ""},
			)
		}
		for _, wc := range r.counts {
			ap, tp := r.apiPhases[wc], tr.phases[wc]
			dispatch, caused := r.profiled(ap), r.profiled(tp)
			whole := tp.perUpdate(tp.serverMs) + caused
			p := func(s string) string { return fmt.Sprintf("W=%d: %s", wc, s) }
			share := func(ph nodePhase) float64 {
				if ph.expected == 0 {
					return nan
				}
				return 100 * float64(ph.delivered) / float64(ph.expected)
			}
			wrong := func(ph nodePhase) float64 { return float64(ph.missing + ph.extra + ph.mismatched) }
			missVerdict := "0 met"
			if wrong(tp) > 0 || tp.delivered < tp.expected || tp.ended > 0 {
				missVerdict = "0 NOT MET"
			}
			rows = append(rows,
				row{label, p("updates written"), "/s", float64(ap.w.writes) / r.o.duration.Seconds(), float64(tp.w.writes) / r.o.duration.Seconds(), ""},
				row{label, p("CPU per update: apiserver dispatch (its profile) / tier processes"), "ms", dispatch, tp.perUpdate(tp.serverMs), ""},
				row{label, p("apiserver CPU per update the tier causes (its profile)"), "ms", nan, caused, ""},
				row{label, p("whole CPU per update: dispatch / tier + what it causes"), "ms", dispatch, whole, verdict(ratioOf(whole, dispatch), 0.5)},
				row{label, p("the same from the apiserver's process totals: dispatch / what the tier causes"), "ms", ap.perUpdate(ap.apiMs) - r.alone.at(ap.start), tp.perUpdate(tp.apiMs) - r.alone.at(tp.start), ""},
				row{label, p("delivery latency p50"), "ms", msd(ap.lat.quantile(0.5)), msd(tp.lat.quantile(0.5)), ""},
				row{label, p("delivery latency p99"), "ms", msd(ap.lat.quantile(0.99)), msd(tp.lat.quantile(0.99)), verdict(ratioOf(msd(tp.lat.quantile(0.99)), msd(ap.lat.quantile(0.99))), 1.5)},
				row{label, p("events delivered / expected"), "%", share(ap), share(tp), ""},
				row{label, p("missing + extra objects + RV mismatches vs apiserver LIST"), "", wrong(ap), wrong(tp), missVerdict},
				row{label, p("watchers opening: LIST p50 (-node-openers at once)"), "ms", pct(ap.openLat, 50), pct(tp.openLat, 50), ""},
				row{label, p("watchers opening: WATCH until its headers, p50"), "ms", pct(ap.watchLat, 50), pct(tp.watchLat, 50), ""},
				row{label, p("watchers opening: all W open"), "s", ap.openTime.Seconds(), tp.openTime.Seconds(), ""},
			)
			if tp.upstream != "" {
				notes = append(notes, fmt.Sprintf("%s, W=%d: the tier's requests to the apiserver per 1000 updates: %s", tr.t.name, wc, tp.upstream))
			}
		}
		lo, hi := r.counts[0], r.counts[len(r.counts)-1]
		if lo != hi {
			pl, ph := tr.phases[lo], tr.phases[hi]
			scale := ratioOf(ph.perUpdate(ph.serverMs), pl.perUpdate(pl.serverMs))
			rows = append(rows, row{label, fmt.Sprintf("tier processes' CPU per update, W=%d / W=%d", hi, lo), "x", nan, scale, verdict(scale, 2)})
		}
		if math.IsNaN(tr.index) {
			notes = append(notes, fmt.Sprintf("%s: index memory / cached bytes: n/a (no cachetier_*index*_bytes on its /metrics; cached Pods %.1f MiB)", tr.t.name, tr.cached/mib))
		} else {
			share := 100 * tr.index / tr.cached
			rows = append(rows, row{label, "index memory / cached bytes (" + strings.Join(tr.indexNames, ", ") + ")", "%", nan, share, verdict(share, 5)})
		}
	}
	var alone []string
	for _, b := range r.alone {
		alone = append(alone, fmt.Sprintf("%.3f", b.perWrite))
	}
	fmt.Fprintf(w, "node-scoped reads and watches: %d Pods (%.0f B of JSON each) on %d nodes; %d updates/s for %s per phase; the apiserver's CPU per update with nothing watching, before each server's phases and at the end: %s ms (each phase is compared with the runs either side of it, interpolated in time); load average %s\n",
		r.o.pods, r.podSize, r.o.nodes, r.o.rate, r.o.duration, strings.Join(alone, " / "), loadAvg())
	printTable(w, rows)
	fmt.Fprintln(w, "CPU per update: over the writer's run and 1 s after it, per successful write. Apiserver dispatch = from its CPU profile over the same window, the samples serving watches (watch handlers' encode and write, the cacher's dispatch) and its HTTP/2 connections' frame writes, above the writer-alone runs' (the control plane's own Pod watchers, the writer's responses; dispatchcpu.go).")
	fmt.Fprintln(w, "The tier's whole cost = its processes' CPU + the apiserver's CPU serving the tier the same way (its ingestion watch; the tier's other requests to the apiserver are listed below). From process totals: the apiserver's CPU with W watchers (or the tier) - with nothing watching, interpolated between the writer-alone runs; the drift of the writes' own cost makes it noisy below ~1 ms. LIST by node: sequential, random nodes; the apiserver's CPU above its idle rate.")
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	var ids []int
	for wc := range r.apiPhases {
		ids = append(ids, wc)
	}
	sort.Ints(ids)
	for _, wc := range ids {
		if ph := r.apiPhases[wc]; ph.firstErr != nil {
			fmt.Fprintf(w, "apiserver, W=%d: a watch ended early: %v\n", wc, ph.firstErr)
		}
	}
	for _, tr := range r.tiers {
		for _, wc := range r.counts {
			if ph := tr.phases[wc]; ph.firstErr != nil {
				fmt.Fprintf(w, "%s, W=%d: a watch ended early: %v\n", tr.t.name, wc, ph.firstErr)
			}
		}
	}
}

package main

// -mode apicost and -mode quietread (issue 12): what the tier's reads cost
// kube-apiserver, and how long a consistent read of a quiet resource waits
// while other resources change.
//
// Both run a standalone tier and a fleet (-fleet shards, default 2) at
// once, each registered with the control plane's aggregation layer by an
// APIService (hack/tierproc, as `make run` and the e2e tests do), caching
// the ConfigMaps of the data set's namespace.
//
//   - apicost: the apiserver's CPU (utime+stime, /proc) per LIST it serves
//     itself (consistent, the data set's namespace), then per LIST it only
//     causes: a tier LIST sent to the tier directly and through the
//     aggregator, consistent and resourceVersion=0. Each figure is the CPU
//     over the reads minus the apiserver's idle CPU over the same time
//     (its rate measured over a window as long, just before), divided by
//     the reads; the ratio is against the apiserver's own LIST.
//   - quietread (quietread.go): a writer renews a Lease every second
//     (every real cluster has them); right after each renewal the bench
//     starts one consistent read (LIST of a 50-object namespace, or GET of
//     one of its objects, alternately) of the quiet ConfigMaps, without
//     waiting for the previous one: to the apiserver, to the standalone
//     tier and to the fleet's front. Each such read needs the tier to
//     prove progress past the renewal's RV. Latency p50/p99 per server,
//     the apiserver's CPU per tier read (RV fetches and progress probes),
//     and each tier read placed against the apiserver's bookmark ticks.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/tierproc"
)

type apiCostOptions struct {
	tierReads int // tier LISTs per scenario
	apiLists  int // the apiserver's own LISTs
	quietObjs int // quietread: ConfigMaps in the quiet namespace
	quietIter int // quietread: reads per server
	quietCold int // quietread: reads per tier after its progress probes stopped
	settle    time.Duration
}

// freshOptions are the flags of the apiserver-cost and freshness modes.
type freshOptions struct {
	probe       *probeCostOptions
	probeCounts *string
	api         *apiCostOptions
}

func freshFlags() freshOptions {
	po, counts := probeCostFlags()
	return freshOptions{probe: po, probeCounts: counts, api: apiCostFlags()}
}

// runFreshMode runs -mode probecost, apicost or quietread; handled is
// false for the other modes.
func runFreshMode(ctx context.Context, mode string, o options, small dataset, fo freshOptions) (handled bool, err error) {
	switch mode {
	case "probecost":
		if fo.probe.counts, err = parseCounts(*fo.probeCounts); err != nil {
			return true, err
		}
		return true, runProbeCost(ctx, o, *fo.probe)
	case "apicost":
		return true, runAPICost(ctx, o, small, fo.api)
	case "quietread":
		return true, runQuietRead(ctx, o, fo.api)
	}
	return false, nil
}

func apiCostFlags() *apiCostOptions {
	var a apiCostOptions
	flag.IntVar(&a.tierReads, "apicost-reads", 100, "apicost: tier LISTs per scenario (tier kind x path x read)")
	flag.IntVar(&a.apiLists, "apicost-api-lists", 20, "apicost: LISTs the apiserver serves itself (the denominator)")
	flag.IntVar(&a.quietObjs, "quiet-objects", 50, "quietread: ConfigMaps in the quiet namespace")
	flag.IntVar(&a.quietIter, "quiet-reads", 60, "quietread: consistent reads per server (one per Lease renewal, so about one per second)")
	flag.IntVar(&a.quietCold, "quiet-cold-reads", 6, "quietread: then reads per tier each after 14 s without one (its progress probes stopped)")
	// The tier keeps its progress probes going 10 s after the last read
	// that needed one (upstream.probeLinger): let them end before the
	// next window, so one scenario's probes do not count in the next.
	flag.DurationVar(&a.settle, "apicost-settle", 12*time.Second, "pause between scenarios (apicost, quietread), and before the apiserver's idle rate is measured for the whole-cost rows (list, watchlist, nodes)")
	return &a
}

// benchTiers is a standalone tier and a fleet, both behind the aggregator.
type benchTiers struct {
	kinds []tierKind
}

type tierKind struct {
	name            string
	direct, viaAggr *rest.Config // the process itself; through the aggregator
	// metrics are the /metrics URLs of the processes that talk to the
	// apiserver (the standalone process, or the fleet's shards), read
	// with metricsClient.
	metrics       []string
	metricsClient *http.Client
}

// startBenchTiers starts both tiers caching the ConfigMaps of the
// namespaces labelled bench=<set>.
func startBenchTiers(ctx context.Context, env *benchEnv, o options, set string) (*benchTiers, error) {
	spec := v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{{
		Version: "v1", Resource: "configmaps",
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": set}},
	}}}
	shards := max(o.fleet, 2)
	start := time.Now()
	st, err := tierproc.Start(ctx, env.cp, tierproc.Options{Binary: o.binary, Profile: "bench", Spec: spec})
	if err != nil {
		return nil, err
	}
	fl, err := tierproc.StartFleet(ctx, env.cp, tierproc.FleetOptions{
		Options: tierproc.Options{Binary: o.binary, Profile: "benchfleet", Spec: spec, ServiceIPIndex: 51},
		Shards:  shards,
	})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "bench: standalone tier and fleet (%d shards) registered in %s\n", shards, time.Since(start).Round(time.Millisecond))
	var b benchTiers
	for _, t := range []struct {
		name    string
		t       *tierproc.Tier
		metrics []string
	}{{"standalone", st, []string{st.DirectURL + "/metrics"}}, {fmt.Sprintf("fleet (%d shards)", shards), fl.Tier, fl.ShardMetricsURLs}} {
		direct := rest.CopyConfig(env.admin)
		direct.Host = t.t.DirectURL + t.t.Paths.Prefix
		direct.CAData, direct.CAFile, direct.ServerName = t.t.DirectCA, "", t.t.ServerName
		aggr := rest.CopyConfig(env.admin)
		aggr.Host = t.t.AggregatedURL
		mc, err := rest.HTTPClientFor(direct)
		if err != nil {
			return nil, err
		}
		k := tierKind{name: t.name, direct: direct, viaAggr: aggr, metricsClient: mc}
		for _, u := range t.metrics {
			if !strings.HasSuffix(u, "/metrics") {
				u += "/metrics"
			}
			k.metrics = append(k.metrics, u)
		}
		b.kinds = append(b.kinds, k)
	}
	return &b, nil
}

// startSeededTiers starts the control plane, seeds d into its namespace
// (returned) and starts both tiers caching it. The caller stops env.cp.
func startSeededTiers(ctx context.Context, o options, d dataset) (*benchEnv, *benchTiers, string, error) {
	env, err := startEnv(ctx, &o)
	if err != nil {
		return nil, nil, "", err
	}
	ns := "bench-" + d.name
	if _, err := seed(ctx, env.kc, ns, d, o.concurrency); err != nil {
		env.cp.Stop()
		return nil, nil, "", err
	}
	tiers, err := startBenchTiers(ctx, env, o, d.name)
	if err != nil {
		env.cp.Stop()
		return nil, nil, "", err
	}
	return env, tiers, ns, nil
}

// upstreamCounters sums, over the tier's processes, the counters of its
// requests to the apiserver for freshness: RV fetches, and progress probes
// by outcome ("probes <outcome>").
func (k tierKind) upstreamCounters() map[string]float64 {
	return upstreamCounters(k.metricsClient, k.metrics)
}

// upstreamCounters sums the freshness request counters over the /metrics
// of urls.
func upstreamCounters(c *http.Client, urls []string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range scrapeMetrics(c, urls) {
		var name string
		switch {
		case strings.HasPrefix(line, "cachetier_upstream_rv_fetches_total{"):
			name = "RV fetches"
		case strings.HasPrefix(line, "cachetier_upstream_progress_probes_total{"):
			_, rest, _ := strings.Cut(line, `outcome="`)
			outcome, _, _ := strings.Cut(rest, `"`)
			name = "probes " + outcome
		default:
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			out[name] += v
		}
	}
	return out
}

// scrapeMetrics is the sample lines of every /metrics URL (comments
// dropped; URLs that fail are skipped).
func scrapeMetrics(c *http.Client, urls []string) []string {
	var out []string
	for _, u := range urls {
		resp, err := c.Get(u)
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			continue
		}
		for _, line := range strings.Split(string(body), "\n") {
			if line != "" && !strings.HasPrefix(line, "#") {
				out = append(out, line)
			}
		}
	}
	return out
}

// counterDelta formats after - before, per counter.
func counterDelta(before, after map[string]float64, per float64) string {
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		if d := after[n] - before[n]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", n, d/per))
		}
	}
	return strings.Join(parts, ", ")
}

// readAll sends GET url (gzip accepted, as kubectl does) and reads the
// body to its end.
func readAll(c *http.Client, u string) error {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %d %s", u, resp.StatusCode, b)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// callCost is what a run of calls cost, per call (ms).
type callCost struct {
	// api is the apiserver's CPU with its idle CPU over the same time
	// subtracted; apiIdle the idle share subtracted.
	api, apiIdle float64
	// server is the CPU of the other processes measured (a tier's), idle
	// not subtracted (a tier with nothing to do uses none).
	server float64
	lat    []float64
}

// measureCalls runs n calls of read and returns their cost: the
// apiserver's (pid apiPID) CPU per call with its idle CPU over the same
// time subtracted (idle measured just before, over a window as long as
// the calls are expected to take, at least 5 s), the idle share per call,
// the CPU per call of the processes server, and the calls' latencies.
// settle separates the warm-up reads from the idle window: what they
// started in the tier (progress probes linger 10 s after the last read
// that asked for one) must not run during it, or their cost would be
// subtracted. rewarm, when set, runs between the idle window and the
// measured calls (its cost counts with theirs).
func measureCalls(apiPID int, server []int, n int, settle time.Duration, read, rewarm func() error) (callCost, error) {
	var c callCost
	if err := read(); err != nil { // warm-up (connections, caches)
		return c, err
	}
	expected := estimateDuration(func() (time.Duration, error) {
		start := time.Now()
		err := read()
		return time.Since(start), err
	}, n)
	time.Sleep(settle)
	idlePerSecond := idleCPU(apiPID, expected)
	c0, s0 := cpuTicks(apiPID), cpuTicksAll(server)
	if rewarm != nil {
		if err := rewarm(); err != nil {
			return c, err
		}
	}
	start := time.Now()
	for range n {
		t0 := time.Now()
		if err := read(); err != nil {
			return c, err
		}
		c.lat = append(c.lat, ms(time.Since(t0)))
	}
	elapsed := time.Since(start)
	c.api = aboveIdle(cpuTicks(apiPID)-c0, idlePerSecond, elapsed) / float64(n)
	c.apiIdle = idlePerSecond * elapsed.Seconds() / float64(n)
	c.server = ticksMs(cpuTicksAll(server)-s0) / float64(n)
	return c, nil
}

func runAPICost(ctx context.Context, o options, d dataset, a *apiCostOptions) error {
	env, tiers, ns, err := startSeededTiers(ctx, o, d)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	apiClient, err := rest.HTTPClientFor(env.admin)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: load average before %s\n", loadAvg())
	own, err := measureCalls(env.apiPID, nil, a.apiLists, a.settle, func() error { return readAll(apiClient, env.admin.Host+path) }, nil)
	if err != nil {
		return err
	}
	apiList, apiIdle := own.api, own.apiIdle
	type costRow struct {
		tier, via, read string
		cpu, idle       float64
		p50             float64
		target          float64
	}
	var rows []costRow
	for _, k := range tiers.kinds {
		for _, v := range []struct {
			name string
			cfg  *rest.Config
		}{{"direct", k.direct}, {"aggregator", k.viaAggr}} {
			client, err := rest.HTTPClientFor(v.cfg)
			if err != nil {
				return err
			}
			for _, rd := range []struct{ name, query string }{{"consistent", ""}, {"RV=0", "?resourceVersion=0"}} {
				u := v.cfg.Host + path + rd.query
				c, err := measureCalls(env.apiPID, nil, a.tierReads, a.settle, func() error { return readAll(client, u) }, nil)
				if err != nil {
					return err
				}
				cpu, idle, lat := c.api, c.apiIdle, c.lat
				target := 0.15
				if v.name == "direct" {
					target = map[string]float64{"consistent": 0.03, "RV=0": 0.01}[rd.name]
				}
				rows = append(rows, costRow{k.name, v.name, rd.name, cpu, idle, pct(lat, 50), target})
				fmt.Fprintf(os.Stderr, "bench: %s %s %s: %.3f ms apiserver CPU per LIST\n", k.name, v.name, rd.name, cpu)
			}
		}
	}
	fmt.Printf("apiserver CPU per LIST (ms, idle subtracted): %d x %s ConfigMaps; the apiserver's own consistent LIST %.2f ms (idle share %.2f, %d LISTs); %d tier LISTs per row; load average after %s\n",
		d.count, human(d.size), apiList, apiIdle, a.apiLists, a.tierReads, loadAvg())
	fmt.Printf("%-18s %-11s %-11s %12s %10s %12s %10s %8s\n", "tier", "path", "read", "apiserver ms", "idle ms", "/ own LIST", "target", "p50 ms")
	for _, r := range rows {
		verdict := "met"
		if r.cpu/apiList > r.target {
			verdict = "NOT MET"
		}
		fmt.Printf("%-18s %-11s %-11s %12.3f %10.3f %12.4f %10s %8.1f\n", r.tier, r.via, r.read, r.cpu, r.idle, r.cpu/apiList,
			fmt.Sprintf("<=%.2f %s", r.target, verdict), r.p50)
	}
	return nil
}

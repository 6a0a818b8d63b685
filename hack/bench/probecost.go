package main

// -mode probecost: what one consistent read's RV fetch costs kube-apiserver,
// per kind of request, as the resource grows (issue 12). No tier runs: the
// bench sends the requests itself, sequentially, and reads the apiserver's
// CPU (utime+stime, /proc) over them, minus its idle CPU over a window of
// the same length measured just before. The resource is ConfigMaps; the
// counts are its total size in the cluster (the RV fetch is cluster-wide
// for cluster-scoped resources, and the old one was for every resource).

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// probeCandidate is one request that returns the apiserver's current RV.
// The query strings mirror cache-server/internal/upstream (rvfetch.go):
// the "after" candidates are the requests the tier sends now.
type probeCandidate struct {
	name, path, query string
}

// probeFetchNamespace / probeFetchName: upstream.rvFetchNamespace and
// rvFetchName (an object no client can have created).
const (
	probeFetchNamespace = "cachetier-rv-fetch"
	probeFetchName      = "cachetier:rv-fetch"
)

func probeCandidates() []probeCandidate {
	const watchList = "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=10"
	cluster := "/api/v1/configmaps"
	nsPath := "/api/v1/namespaces/" + probeFetchNamespace + "/configmaps"
	byName := "fieldSelector=" + url.QueryEscape("metadata.name="+probeFetchName)
	return []probeCandidate{
		{"before: cluster-wide watch-list, name with '/'", cluster, watchList + "&fieldSelector=" + url.QueryEscape("metadata.name=cachetier/rv-probe")},
		{"namespaced watch-list, no name (absent namespace)", nsPath, watchList},
		{"after: namespaced watch-list of one name", nsPath, watchList + "&" + byName},
		{"before (WatchList off): cluster-wide LIST limit=1", cluster, "limit=1"},
		{"namespaced LIST limit=1 (absent namespace)", nsPath, "limit=1"},
		{"after (WatchList off): namespaced LIST of one name", nsPath, byName},
		{"LIST of another resource (leases, limit=1)", "/apis/coordination.k8s.io/v1/leases", "limit=1"},
	}
}

type probeCostOptions struct {
	counts   []int
	requests int
	objSize  int
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad count %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func runProbeCost(ctx context.Context, o options, po probeCostOptions) error {
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	client, err := rest.HTTPClientFor(env.admin)
	if err != nil {
		return err
	}
	cands := probeCandidates()
	type result struct{ cpuMs, idleMs, p50 float64 }
	results := map[int][]result{}
	have := 0
	for i, n := range po.counts {
		if n > have {
			d := dataset{name: fmt.Sprintf("probe%d", i), count: n - have, size: po.objSize}
			start := time.Now()
			if _, err := seed(ctx, env.kc, "bench-"+d.name, d, o.concurrency); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "bench: seeded %d more ConfigMaps (%d in all) in %s\n", d.count, n, time.Since(start).Round(time.Second))
			have = n
		}
		time.Sleep(2 * time.Second)
		for _, c := range cands {
			cost, err := measureCalls(env.apiPID, nil, po.requests, 0, func() error {
				_, err := probeOnce(client, env.admin.Host+c.path+"?"+c.query)
				return err
			}, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			results[n] = append(results[n], result{cpuMs: cost.api, idleMs: cost.apiIdle, p50: pct(cost.lat, 50)})
		}
	}
	fmt.Printf("apiserver CPU per RV fetch (ms, idle subtracted) and latency; %d sequential requests each, ConfigMaps of %d B; load average %s\n", po.requests, po.objSize, loadAvg())
	fmt.Printf("%-52s", "request")
	for _, n := range po.counts {
		fmt.Printf(" | %9s %9s %8s", fmt.Sprintf("%dk cpu", n/1000), "idle", "p50 ms")
	}
	fmt.Println()
	for i, c := range cands {
		fmt.Printf("%-52s", c.name)
		for _, n := range po.counts {
			r := results[n][i]
			fmt.Printf(" | %9.3f %9.3f %8.2f", r.cpuMs, r.idleMs, r.p50)
		}
		fmt.Println()
	}
	return nil
}

// probeOnce sends one RV-fetch request and reads it to the RV: a LIST's
// body, or a watch-list's stream up to its initial-events-end bookmark.
func probeOnce(c *http.Client, u string) (time.Duration, error) {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	if !strings.Contains(u, "watch=1") {
		_, err = io.Copy(io.Discard, resp.Body)
		return time.Since(start), err
	}
	if err := readToInitialEventsEnd(bufio.NewReaderSize(resp.Body, 16<<10)); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// readToInitialEventsEnd reads watch events until the bookmark that ends a
// watch-list's initial events.
func readToInitialEventsEnd(br *bufio.Reader) error {
	for {
		head, err := readEventHead(br, 512)
		if err != nil {
			return fmt.Errorf("watch-list ended before its initial-events-end bookmark: %w", err)
		}
		if bytes.Contains(head, []byte(`"ERROR"`)) {
			return fmt.Errorf("ERROR event: %s", head)
		}
		if bytes.Contains(head, []byte(`"BOOKMARK"`)) && bytes.Contains(head, []byte(metav1.InitialEventsAnnotationKey)) {
			return nil
		}
	}
}

// estimateDuration times a few calls of send and extrapolates to n.
func estimateDuration(send func() (time.Duration, error), n int) time.Duration {
	const probes = 5
	start := time.Now()
	for range probes {
		if _, err := send(); err != nil {
			break
		}
	}
	return time.Since(start) * time.Duration(n) / probes
}

// idleCPU is pid's CPU use in ms per second, measured over d (at least
// 5 s, so a 10 ms clock tick is a small part of it) while the bench is
// idle.
func idleCPU(pid int, d time.Duration) float64 {
	d = max(d, 5*time.Second)
	c0 := cpuTicks(pid)
	start := time.Now()
	time.Sleep(d)
	return ticksMs(cpuTicks(pid)-c0) / time.Since(start).Seconds()
}

func ticksMs(t uint64) float64 { return float64(t) * 1000 / clkTck }

// loadAvg is /proc/loadavg's three averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// probeCostFlags registers -mode probecost's flags; parse the counts after
// flag.Parse.
func probeCostFlags() (*probeCostOptions, *string) {
	var po probeCostOptions
	counts := flag.String("probe-counts", "10000,100000", "probecost: ConfigMaps in the cluster at each measurement (ascending; the bench adds the difference)")
	flag.IntVar(&po.requests, "probe-requests", 300, "probecost: sequential requests per candidate and count")
	flag.IntVar(&po.objSize, "probe-object-size", 256, "probecost: bytes of data per ConfigMap")
	return &po, counts
}

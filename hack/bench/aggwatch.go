package main

// -mode aggwatch (issue 20): kubelet-like watches through the aggregator.
//
// A control plane with the aggregation layer and a standalone tier behind
// an APIService (hack/tierproc, as `make run` does) caching Pods; Pods
// bound to -watchers nodes (names only: no kubelet runs). Then, as every
// kubelet does, one watch per node — a LIST of the node's Pods
// (fieldSelector=spec.nodeName=<node>), then a watch from its
// resourceVersion with bookmarks and without timeoutSeconds — all through
// the aggregator below status.serverURL's prefix (aggpath.Paths.Prefix),
// or with -old-path below the group-version's own path. A writer patches
// Pods meanwhile. A watch the server ends is counted, its lifetime kept,
// and reopened from its last resourceVersion, as a reflector does.
//
// Reported: watches ended by the server (0 expected below the prefix: the
// apiserver treats them as long-running; below the old path they are cut
// at its --request-timeout), events received against updates written, and
// the apiserver's priority-and-fairness and in-flight gauges sampled before
// the watches are opened and while they are open (max/avg), next to its
// CPU and RSS: a proxied watch must not hold a seat. The watchers are in
// group system:nodes, so priority and fairness treats them as kubelets.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/tierproc"
)

type aggWatchOptions struct {
	oldPath     bool
	podsPerNode int
	updates     int // pod patches per second
	connections int // HTTP/2 connections to the apiserver the watches share
	sample      time.Duration
	baseline    time.Duration
}

func aggWatchFlags() *aggWatchOptions {
	var a aggWatchOptions
	flag.BoolVar(&a.oldPath, "old-path", false, "aggwatch: watch below the group-version's own path (the server URL of the first releases, cut at the apiserver's --request-timeout) instead of status.serverURL's")
	flag.IntVar(&a.podsPerNode, "aggwatch-pods-per-node", 4, "aggwatch: Pods bound to each node")
	flag.IntVar(&a.updates, "aggwatch-updates", 10, "aggwatch: Pod patches per second while the watches are open")
	flag.IntVar(&a.connections, "aggwatch-connections", 50, "aggwatch: client connections the watches are spread over (kubelets have one each)")
	flag.DurationVar(&a.sample, "aggwatch-sample", 2*time.Second, "aggwatch: interval of the apiserver /metrics samples")
	flag.DurationVar(&a.baseline, "aggwatch-baseline", 30*time.Second, "aggwatch: sampling before the watches are opened")
	return &a
}

// The watchers authenticate as kubelets do (group system:nodes), so that
// priority and fairness classifies them as it classifies kubelets: flow
// schema system-nodes, priority level system (the admin would be exempt).
const (
	watcherUser        = "system:node:bench"
	watcherGroup       = "system:nodes"
	watcherFlowSchema  = "system-nodes"
	watcherPriority    = "system"
	watcherClusterRole = "bench-kubelet"
)

// apiGauges are the apiserver gauges sampled, summed over their series
// (all priority levels, then the watchers').
var apiGauges = []string{
	"apiserver_flowcontrol_current_executing_seats",
	"apiserver_flowcontrol_current_executing_requests",
	"apiserver_flowcontrol_current_inqueue_requests",
	`apiserver_flowcontrol_current_executing_seats{priority_level="` + watcherPriority + `"}`,
	`apiserver_flowcontrol_current_executing_requests{priority_level="` + watcherPriority + `"}`,
	`apiserver_flowcontrol_current_inqueue_requests{priority_level="` + watcherPriority + `"}`,
	`apiserver_current_inflight_requests{request_kind="readOnly"}`,
	`apiserver_current_inflight_requests{request_kind="mutating"}`,
	"apiserver_longrunning_requests",
}

// runAggWatch runs -mode aggwatch. -watchers and -duration apply when set
// (their defaults are fanout's); otherwise 500 watchers for 10 minutes.
func runAggWatch(ctx context.Context, o options, wo *watchOptions, a *aggWatchOptions) error {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	nodes, duration := 500, 10*time.Minute
	if set["watchers"] {
		nodes = wo.watchers
	}
	if set["duration"] {
		duration = wo.duration
	}
	if err := raiseNoFile(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: raising RLIMIT_NOFILE:", err)
	}
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	const ns = "bench-aggwatch"
	if _, err := env.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	pods := nodes * a.podsPerNode
	start := time.Now()
	names := make([]string, pods)
	err = createAll(ctx, 0, pods, o.concurrency, func(ctx context.Context, i int) error {
		p := benchPod(i, "", benchNodeName(i%nodes))
		names[i] = p.Name
		_, err := env.kc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: %d Pods on %d nodes in %s\n", pods, nodes, time.Since(start).Round(time.Millisecond))
	tier, err := tierproc.Start(ctx, env.cp, tierproc.Options{Binary: o.binary, Profile: "bench", Spec: v1alpha1.CacheProfileSpec{
		Resources: []v1alpha1.CachedResource{{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}}},
	}})
	if err != nil {
		return err
	}
	through := tier.AggregatedURL
	if a.oldPath {
		through = tier.RootURL
	}
	fmt.Fprintf(os.Stderr, "bench: tier registered; watching through %s\n", through)
	watcherCfg, err := kubeletLikeConfig(ctx, env, tier.Paths.Group, through+"/api/v1/pods?limit=1")
	if err != nil {
		return err
	}
	tierCfg := rest.CopyConfig(env.admin)
	tierCfg.Host, tierCfg.CAData, tierCfg.CAFile, tierCfg.ServerName = tier.DirectURL, tier.DirectCA, "", tier.ServerName

	fmt.Fprintf(os.Stderr, "bench: sampling the apiserver for %s before the watches\n", a.baseline)
	before := sampleAPIServer(env.admin, env.apiPID, a.sample)
	time.Sleep(a.baseline)
	before.stop()

	clients, err := fanoutTransports(watcherCfg, a.connections)
	if err != nil {
		return err
	}
	wctx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	ws := &aggWatchers{}
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws.run(wctx, clients[i%len(clients)], through+"/api/v1/namespaces/"+ns+"/pods", benchNodeName(i))
		}()
	}
	opened := time.Now()
	for ws.established.Load() < int64(nodes) && time.Since(opened) < 3*time.Minute {
		time.Sleep(100 * time.Millisecond)
	}
	established := ws.established.Load()
	fmt.Fprintf(os.Stderr, "bench: %d of %d watches open in %s; holding them for %s with %d Pod patches/s\n", established, nodes, time.Since(opened).Round(time.Millisecond), duration, a.updates)
	tierWatchers := sumSeries(getBody(tierCfg, "/metrics"), "cachetier_watchers")
	during := sampleAPIServer(env.admin, env.apiPID, a.sample)
	written, failed := patchPods(ctx, env.kc.CoreV1().RESTClient(), ns, names, a.updates, duration)
	during.stop()
	// The last patches' events.
	drain := time.Now()
	for ws.modified.Load() < written && time.Since(drain) < 15*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	stopWatches()
	wg.Wait()

	path := "status.serverURL (…/v1alpha1/watch)"
	if a.oldPath {
		path = "the group-version's own path (…/v1alpha1, -old-path)"
	}
	fmt.Printf("aggwatch: %d node-scoped watches of %d Pods through the aggregator below %s, held %s (load average at the end: %s)\n",
		nodes, pods, path, duration, loadAvg())
	lifetimes := ws.lifetimes()
	fmt.Printf("nodes whose watch opened within 3 minutes: %d of %d\n", established, nodes)
	fmt.Printf("watches ended by the server: %d", len(lifetimes))
	if len(lifetimes) > 0 {
		fmt.Printf(" (lifetime min %s, median %s, max %s)", lifetimes[0].Round(100*time.Millisecond), lifetimes[len(lifetimes)/2].Round(100*time.Millisecond), lifetimes[len(lifetimes)-1].Round(100*time.Millisecond))
	}
	fmt.Printf("; 410 Expired %d\n", ws.expired.Load())
	fmt.Printf("failed LISTs or watch requests (each retried after 1 s): %d\n", ws.failures.Load())
	for _, f := range ws.failureCounts() {
		fmt.Printf("  %6d  %s\n", f.n, f.msg)
	}
	fmt.Printf("Pod patches written %d (failed %d); MODIFIED events received %d, bookmarks %d\n", written, failed, ws.modified.Load(), ws.bookmarks.Load())
	fmt.Printf("the tier's cachetier_watchers while open: %.0f\n", tierWatchers)
	fmt.Printf("APIService at the end: %s\n", apiServiceCondition(env.admin, "v1alpha1."+tier.Paths.Group))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "apiserver\tbefore max\tbefore avg\twatches open max\twatches open avg\t")
	for _, g := range append(append([]string{}, apiGauges...), "CPU (millicores)", "RSS (MiB)") {
		b, d := before.stats(g), during.stats(g)
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.1f\t%.2f\t\n", g, b.max, b.avg, d.max, d.avg)
	}
	_ = tw.Flush()
	fmt.Printf("samples: %d before, %d while open, every %s (each /metrics GET is itself one executing request)\n", before.n(), during.n(), a.sample)
	// What the apiserver's own request metrics recorded for the profile's
	// group: the verb and resource it saw.
	// What the apiserver recorded for the watchers' requests: priority and
	// fairness's dispatches and execution time (a request's seat is held
	// for its execution, which ends at delegation to the tier), and any
	// request series naming the profile's group.
	body := getBody(env.admin, "/metrics")
	sum := sumSeries(body, `apiserver_flowcontrol_request_execution_seconds_sum{flow_schema="`+watcherFlowSchema+`"}`)
	count := sumSeries(body, `apiserver_flowcontrol_request_execution_seconds_count{flow_schema="`+watcherFlowSchema+`"}`)
	if count > 0 {
		fmt.Printf("flow schema %s: %.0f requests dispatched, mean execution (seat held) %.1f ms\n", watcherFlowSchema, count, sum/count*1000)
	}
	fmt.Println("the apiserver's series for them:")
	for line := range strings.SplitSeq(body, "\n") {
		watcher := strings.Contains(line, `flow_schema="`+watcherFlowSchema+`"`) && (strings.HasPrefix(line, "apiserver_flowcontrol_dispatched_requests_total{") ||
			strings.HasPrefix(line, "apiserver_flowcontrol_request_execution_seconds_count{") || strings.HasPrefix(line, "apiserver_flowcontrol_request_execution_seconds_sum{"))
		group := strings.Contains(line, `group="`+tier.Paths.Group+`"`) && !strings.Contains(line, "_bucket{")
		if watcher || group {
			fmt.Println("  " + line)
		}
	}
	return nil
}

// apiServiceCondition is the APIService's Available condition as
// "status reason: message".
func apiServiceCondition(admin *rest.Config, name string) string {
	var a struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(getBody(admin, "/apis/apiregistration.k8s.io/v1/apiservices/"+name)), &a); err != nil {
		return err.Error()
	}
	for _, c := range a.Status.Conditions {
		if c.Type == "Available" {
			return c.Status + " " + c.Reason + ": " + c.Message
		}
	}
	return "no Available condition"
}

// kubeletLikeConfig is a client of the apiserver as user system:node:bench
// in group system:nodes, allowed (by RBAC, for this bench only) to read
// Pods and to go through the profile's group, once the apiserver's
// authorizer lets probe through.
func kubeletLikeConfig(ctx context.Context, env *benchEnv, group, probe string) (*rest.Config, error) {
	rbac := env.kc.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: watcherClusterRole},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{group}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: watcherClusterRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: watcherClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: watcherGroup}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	kubeconfig, err := env.cp.UserKubeconfig(watcherUser, watcherGroup)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := listRV(ctx, client, probe)
		if err == nil {
			return cfg, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s cannot read through the tier: %w", watcherUser, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}


// aggWatchers counts what the watches saw.
type aggWatchers struct {
	// opened counts watch responses (200); established the nodes whose
	// first watch opened.
	opened, established, modified, bookmarks, expired, failures atomic.Int64
	mu                                                          sync.Mutex
	ended                                                       []time.Duration
	failedBy                                                    map[string]int // by message
}

type failureCount struct {
	msg string
	n   int
}

// failureCounts are the failures by message, most frequent first.
func (w *aggWatchers) failureCounts() []failureCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []failureCount
	for m, n := range w.failedBy {
		out = append(out, failureCount{m, n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n > out[j].n })
	return out
}

func (w *aggWatchers) lifetimes() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]time.Duration(nil), w.ended...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// run keeps one node's watch open until ctx ends, as a kubelet's
// reflector: LIST, then watch from its RV; a watch the server ends is
// recorded and reopened from the last RV seen (a LIST again after 410).
func (w *aggWatchers) run(ctx context.Context, client *http.Client, base, node string) {
	sel := "fieldSelector=" + url.QueryEscape("spec.nodeName="+node)
	rv := ""
	established := false
	for ctx.Err() == nil {
		if rv == "" {
			var err error
			if rv, err = listRV(ctx, client, base+"?"+sel); err != nil {
				w.failed(ctx, err)
				continue
			}
		}
		opened := time.Now()
		next, ok, err := w.watchOnce(ctx, client, base+"?watch=1&allowWatchBookmarks=true&"+sel+"&resourceVersion="+rv, func() {
			if !established {
				established = true
				w.established.Add(1)
			}
		})
		if next != "" {
			rv = next
		}
		if ctx.Err() != nil {
			return
		}
		if !ok {
			w.failed(ctx, err)
			continue
		}
		if errors.Is(err, errExpired) {
			w.expired.Add(1)
			rv = ""
		}
		w.mu.Lock()
		w.ended = append(w.ended, time.Since(opened))
		w.mu.Unlock()
	}
}

var (
	errExpired = errors.New("410 Expired")
	nodeNames  = regexp.MustCompile(`node-[0-9]+`)
)

func (w *aggWatchers) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	w.failures.Add(1)
	// One line per kind of failure, whichever node it was for.
	msg := nodeNames.ReplaceAllString(strings.TrimSpace(err.Error()), "node-N")
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	w.mu.Lock()
	if w.failedBy == nil {
		w.failedBy = map[string]int{}
	}
	w.failedBy[msg]++
	w.mu.Unlock()
	time.Sleep(time.Second)
}

// watchOnce reads one watch until it ends; it returns the last RV seen and
// whether the watch was opened (200) at all; onOpen runs when it opens.
func (w *aggWatchers) watchOnce(ctx context.Context, client *http.Client, u string, onOpen func()) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", false, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	w.opened.Add(1)
	onOpen()
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	rv := ""
	for {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Code     int `json:"code"`
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			return rv, true, err
		}
		switch ev.Type {
		case "MODIFIED":
			w.modified.Add(1)
		case "BOOKMARK":
			w.bookmarks.Add(1)
		case "ERROR":
			if ev.Object.Code == http.StatusGone {
				return rv, true, errExpired
			}
			return rv, true, fmt.Errorf("ERROR event, code %d", ev.Object.Code)
		}
		if v := ev.Object.Metadata.ResourceVersion; v != "" {
			rv = v
		}
	}
}

// patchPods patches random Pods' labels at rate per second for d; it
// returns the successful and failed patches.
func patchPods(ctx context.Context, c rest.Interface, ns string, names []string, rate int, d time.Duration) (written, failed int64) {
	if rate <= 0 {
		time.Sleep(d)
		return 0, 0
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.After(d)
	for i := 0; ; i++ {
		select {
		case <-end:
			return written, failed
		case <-tick.C:
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{"bench.cachetier.io/tick":"%d"}}}`, i)
		err := c.Patch(types.MergePatchType).Namespace(ns).Resource("pods").Name(names[rand.IntN(len(names))]).Body([]byte(patch)).Do(ctx).Error()
		if err != nil {
			failed++
		} else {
			written++
		}
	}
}

// apiSampler samples the apiserver's gauges, CPU and RSS.
type apiSampler struct {
	mu      sync.Mutex
	samples map[string][]float64
	done    chan struct{}
	stopped chan struct{}
}

func sampleAPIServer(admin *rest.Config, pid int, every time.Duration) *apiSampler {
	s := &apiSampler{samples: map[string][]float64{}, done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(s.stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		c0, t0 := cpuTicks(pid), time.Now()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			body := getBody(admin, "/metrics")
			c1, t1 := cpuTicks(pid), time.Now()
			s.mu.Lock()
			for _, g := range apiGauges {
				s.samples[g] = append(s.samples[g], sumSeries(body, g))
			}
			s.samples["CPU (millicores)"] = append(s.samples["CPU (millicores)"], ticksMs(c1-c0)/t1.Sub(t0).Seconds())
			s.samples["RSS (MiB)"] = append(s.samples["RSS (MiB)"], float64(rss(pid))/mib)
			s.mu.Unlock()
			c0, t0 = c1, t1
		}
	}()
	return s
}

func (s *apiSampler) stop() {
	close(s.done)
	<-s.stopped
}

func (s *apiSampler) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.samples["RSS (MiB)"])
}

type gaugeStats struct{ max, avg float64 }

func (s *apiSampler) stats(name string) gaugeStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.samples[name]
	if len(v) == 0 {
		return gaugeStats{}
	}
	st := gaugeStats{max: v[0]}
	for _, x := range v {
		st.max = max(st.max, x)
		st.avg += x
	}
	st.avg /= float64(len(v))
	return st
}

// getBody is a GET of path at cfg's server; "" on any failure (a sample
// is then missing its series, which sumSeries reads as 0).
func getBody(cfg *rest.Config, path string) string {
	b, err := getOK(cfg, path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return ""
	}
	return string(b)
}

// sumSeries sums the samples of a metric in the Prometheus text format:
// name alone sums every series of the metric; name{labels} selects the
// series with those labels among others (in any order the exporter
// writes them: each label="value" must appear).
func sumSeries(body, name string) float64 {
	metric, want := name, []string(nil)
	if i := strings.IndexByte(name, '{'); i >= 0 {
		metric, want = name[:i], strings.Split(strings.Trim(name[i:], "{}"), ",")
	}
	var sum float64
	for line := range strings.SplitSeq(body, "\n") {
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		match := true
		for _, l := range want {
			if !strings.Contains(","+labels+",", ","+l+",") {
				match = false
			}
		}
		if !match {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			sum += v
		}
	}
	return sum
}

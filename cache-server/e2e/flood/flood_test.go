// Package flood floods the tier, as real processes in front of a real
// kube-apiserver, and checks that priority and fairness keeps it up, fair
// and closed: one client looping full consistent LISTs of a large resource
// and opening hundreds of watch-lists gets the apiserver's 429s with
// Retry-After, while kubelets (users in system:nodes) and a controller (a
// kube-system ServiceAccount, the workload-high flow) keep being served;
// the tier's peak resident memory stays far under a pod's limit; and the
// apiserver_flowcontrol_* metrics show the rejections per priority level
// and flow. The same flood against a tier started with
// --enable-priority-and-fairness=false is measured for comparison (logged,
// not asserted: timings are not asserted beyond generous bounds).
//
// The tiers run as the fleet's ServiceAccount holding exactly the
// ClusterRole the operator renders, so the test also proves that RBAC is
// enough (list/watch on the flowcontrol configuration) and that the
// FlowSchema status write it deliberately lacks costs no more than a log
// line.
package flood

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/gomaxprocs"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/tierproc"
)

// The data: a large resource for the flood (bulkConfigMaps × bulkBytes of
// ConfigMaps), a small namespace the controller reads, and pods spread
// over nodes for the kubelets.
const (
	bulkConfigMaps = 2000
	bulkBytes      = 8 << 10
	teamConfigMaps = 50
	nodes          = 20
	podsPerNode    = 20
)

// The load: flooders (one user, many connections) and the well-behaved.
const (
	listFlooders      = 400 // concurrent full consistent LISTs
	watchListFlooders = 200 // concurrent watch-lists of the same resource
	floodFor          = 15 * time.Second
	// podMemoryLimit is the memory limit of the sample profile's pods
	// (config/samples); the tier must stay far under it.
	podMemoryLimit = 1 << 30
)

const (
	tierNamespace = "cachetier-system"
	fsStrict      = "flood-strict"
)

func spec() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{
		{Version: "v1", Resource: "configmaps"},
		{Version: "v1", Resource: "pods"},
	}}
}

func TestFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("floods real processes for a minute or more")
	}
	ctx := context.Background()
	binary := filepath.Join(t.TempDir(), "cache-server")
	built := make(chan error, 1)
	go func() { built <- tierproc.Build(ctx, binary) }()
	cp := controlplane.StartForTest(t, controlplane.Options{ServiceClusterIPRange: "127.86.0.0/24"})
	admin, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	admin.QPS, admin.Burst = 500, 1000
	kc := kubernetes.NewForConfigOrDie(admin)
	seedStart := time.Now()
	if err := seed(ctx, kc); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d ConfigMaps of %d KiB, %d pods on %d nodes in %s", bulkConfigMaps+teamConfigMaps, bulkBytes>>10, nodes*podsPerNode, nodes, time.Since(seedStart).Round(time.Millisecond))
	tierKubeconfig, err := tierIdentity(ctx, cp, kc)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	ids, err := newIdentities(cp)
	if err != nil {
		t.Fatal(err)
	}

	start := func(name string, idx int, extra ...string) *tierproc.Tier {
		t.Helper()
		tier, err := tierproc.Start(ctx, cp, tierproc.Options{Binary: binary, Profile: name, Spec: spec(), ServiceIPIndex: idx, Kubeconfig: tierKubeconfig, ExtraArgs: extra})
		if err != nil {
			t.Fatal(err)
		}
		return tier
	}

	var withAPF, withoutAPF floodResult
	t.Run("standalone", func(t *testing.T) {
		tier := start("flood", 50)
		withAPF = flood(t, ids, target{url: tier.DirectURL, ca: tier.DirectCA, serverName: tier.ServerName})
		checkProtected(t, ctx, kc, withAPF)
		checkRejectLog(t, tier.Log)
		checkMetrics(t, ids, target{url: tier.DirectURL, ca: tier.DirectCA, serverName: tier.ServerName}, cp.PID(tier.Process), &withAPF)
		checkMemory(t, "standalone", cp.PID(tier.Process), &withAPF)
		t.Run("429 as kube-apiserver answers it", func(t *testing.T) {
			compare429(t, ctx, kc, ids, target{url: cp.URL, ca: cp.ClusterCA.CertPEM}, target{url: tier.DirectURL, ca: tier.DirectCA, serverName: tier.ServerName})
		})
		t.Run("no FlowSchema status write", func(t *testing.T) {
			checkDangling(t, ctx, kc, tier.Log)
		})
	})
	t.Run("standalone without priority and fairness", func(t *testing.T) {
		tier := start("floodoff", 53, "--enable-priority-and-fairness=false")
		withoutAPF = flood(t, ids, target{url: tier.DirectURL, ca: tier.DirectCA, serverName: tier.ServerName})
		checkMemory(t, "standalone without priority and fairness", cp.PID(tier.Process), &withoutAPF)
		if err := cp.StopProcess(tier.Process); err != nil {
			t.Error(err)
		}
	})
	t.Run("fleet front", func(t *testing.T) {
		fl, err := tierproc.StartFleet(ctx, cp, tierproc.FleetOptions{
			Options: tierproc.Options{Binary: binary, Profile: "floodfleet", Spec: spec(), ServiceIPIndex: 52, Kubeconfig: tierKubeconfig},
			Shards:  2,
		})
		if err != nil {
			t.Fatal(err)
		}
		front := target{url: fl.DirectURL, ca: fl.DirectCA, serverName: fl.ServerName}
		r := flood(t, ids, front)
		checkProtected(t, ctx, kc, r)
		checkRejectLog(t, fl.Log)
		checkMetrics(t, ids, front, cp.PID(fl.Process), &r)
		checkShardsBulk(t, fl.ShardMetricsURLs)
		if body, ok := metricsBody(t, fl.FrontMetricsURL); ok {
			checkProcs(t, "front", body)
		}
		checkMemory(t, "fleet front", cp.PID(fl.Process), &r)
	})
	t.Logf("with priority and fairness:    %s; peak RSS %d MiB", withAPF, withAPF.peakRSS>>20)
	t.Logf("without priority and fairness: %s; peak RSS %d MiB", withoutAPF, withoutAPF.peakRSS>>20)
}

// bulkRequests reads cachetier_bulk_requests_total by outcome from a
// /metrics body.
func bulkRequests(body string) map[string]float64 {
	bulk := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		for _, outcome := range []string{"lowered", "failed", "unlowered"} {
			if v, ok := strings.CutPrefix(line, `cachetier_bulk_requests_total{outcome="`+outcome+`"} `); ok {
				bulk[outcome], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return bulk
}

// checkShardsBulk checks that the shards ran their part of the front's
// bulk LISTs lowered while a Go P stayed free (bulkthread.Slots): with
// more than one core, some lowered and none failed.
func checkShardsBulk(t *testing.T, metricsURLs []string) {
	t.Helper()
	for _, u := range metricsURLs {
		body, ok := metricsBody(t, u)
		if !ok {
			continue
		}
		checkProcs(t, "shard "+u, body)
		bulk := bulkRequests(body)
		t.Logf("shard %s: bulk requests %v", u, bulk)
		if bulk["lowered"]+bulk["unlowered"] <= 0 || bulk["failed"] > 0 || (runtime.GOMAXPROCS(0) > 1 && bulk["lowered"] <= 0) {
			t.Errorf("shard %s: bulk requests %v, want the front's bulk LISTs' parts lowered (with more than one core) and none failed", u, bulk)
		}
	}
}

// metricsBody reads a fleet process's /metrics from its plain metrics
// listener at url (what Prometheus scrapes; no client certificate).
func metricsBody(t *testing.T, url string) (string, bool) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Error(err)
		return "", false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%s/metrics: %s", url, resp.Status)
		return "", false
	}
	return readAll(resp), true
}

// checkProcs checks from a process's /metrics body that it runs two Go Ps
// per CPU (package gomaxprocs): the spare Ps let a lowered bulk thread's
// P-holding not keep small requests waiting. The tier processes run on
// this test's CPUs and inherit its environment.
func checkProcs(t *testing.T, name, body string) {
	t.Helper()
	want := gomaxprocs.For(runtime.GOMAXPROCS(0))
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		want = runtime.GOMAXPROCS(0)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_sched_gomaxprocs_threads "); ok {
			if got, err := strconv.ParseFloat(v, 64); err != nil || int(got) != want {
				t.Errorf("%s: go_sched_gomaxprocs_threads %s, want %d", name, v, want)
			}
			return
		}
	}
	t.Errorf("%s: no go_sched_gomaxprocs_threads in /metrics", name)
}

// seed creates the data set.
func seed(ctx context.Context, kc kubernetes.Interface) error {
	for _, ns := range []string{"bulk", "team-a", "workloads", tierNamespace} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	payload := strings.Repeat("x", bulkBytes)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range bulkConfigMaps {
		g.Go(func() error {
			_, err := kc.CoreV1().ConfigMaps("bulk").Create(gctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bulk-%05d", i)},
				Data: map[string]string{"payload": payload}}, metav1.CreateOptions{})
			return err
		})
	}
	for i := range teamConfigMaps {
		g.Go(func() error {
			_, err := kc.CoreV1().ConfigMaps("team-a").Create(gctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("settings-%02d", i)},
				Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
			return err
		})
	}
	for i := range nodes * podsPerNode {
		g.Go(func() error {
			_, err := kc.CoreV1().Pods("workloads").Create(gctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%04d", i)},
				Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%nodes), Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}}},
				metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	// Every user of the test may read what it floods or reads (the tier
	// authorizes each request as the apiserver would).
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "flood-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "flood-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flood-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}}, metav1.CreateOptions{})
	return err
}

// tierIdentity creates what the operator creates for a profile's
// ServiceAccount — its ClusterRole (controllers.BuildClusterRole), the
// binding, the extension-apiserver-authentication reader binding — and
// returns a kubeconfig authenticating as that ServiceAccount.
func tierIdentity(ctx context.Context, cp *controlplane.ControlPlane, kc kubernetes.Interface) (string, error) {
	p := &v1alpha1.CacheProfile{ObjectMeta: metav1.ObjectMeta{Name: "flood"}, Spec: spec()}
	opts := controllers.Options{Namespace: tierNamespace}
	cr, crb, rb := controllers.BuildClusterRole(p), controllers.BuildClusterRoleBinding(p, opts), controllers.BuildAuthReaderBinding(p, opts)
	// No CacheProfile object exists here to own them.
	cr.OwnerReferences, crb.OwnerReferences, rb.OwnerReferences = nil, nil, nil
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if _, err := kc.RbacV1().RoleBindings(rb.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	sa := crb.Subjects[0]
	return cp.UserKubeconfig("system:serviceaccount:"+sa.Namespace+":"+sa.Name, "system:serviceaccounts", "system:serviceaccounts:"+sa.Namespace)
}

// identities are the test's users.
type identities struct {
	flooder, strict, controller, admin identity
	kubelets                           []identity
}

func newIdentities(cp *controlplane.ControlPlane) (identities, error) {
	var ids identities
	var err error
	if ids.flooder, err = newIdentity(cp.ClusterCA, "flooder"); err != nil {
		return ids, err
	}
	if ids.strict, err = newIdentity(cp.ClusterCA, "strict-flooder"); err != nil {
		return ids, err
	}
	// A controller: a kube-system ServiceAccount (FlowSchema
	// kube-system-service-accounts, level workload-high).
	if ids.controller, err = newIdentity(cp.ClusterCA, "system:serviceaccount:kube-system:flood-controller", "system:serviceaccounts", "system:serviceaccounts:kube-system"); err != nil {
		return ids, err
	}
	if ids.admin, err = newIdentity(cp.ClusterCA, "flood-admin", "system:masters"); err != nil {
		return ids, err
	}
	for i := range nodes {
		id, err := newIdentity(cp.ClusterCA, fmt.Sprintf("system:node:node-%d", i), "system:nodes")
		if err != nil {
			return ids, err
		}
		ids.kubelets = append(ids.kubelets, id)
	}
	return ids, nil
}

// floodResult is what one flood measured.
type floodResult struct {
	lists, watchLists, kubelets, controller summary
	// controllerHTTP are the HTTP responses behind the controller's
	// client-go calls (retries included).
	controllerHTTP summary
	listTooMany    []answer
	watchesOpen    int
	peakRSS        int64 // VmHWM of the tier process, bytes
}

func (r floodResult) String() string {
	return fmt.Sprintf("flooder LISTs %s; flooder watch-lists %s; kubelets %s; controller %s (HTTP responses: %s)",
		r.lists, r.watchLists, r.kubelets, r.controller, r.controllerHTTP)
}

// flood runs the load against tgt for floodFor.
func flood(t *testing.T, ids identities, tgt target) floodResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), floodFor)
	defer cancel()
	var wg sync.WaitGroup
	var lists, watchLists, kubelets, controller, controllerHTTP record

	// The well-behaved stop sending when the flood ends, but the requests
	// they sent then complete: cut, they would count as rejections of
	// their level (a request whose client leaves its queue is counted
	// as a "time-out" rejection).
	victimCtx, cancelVictims := context.WithTimeout(context.Background(), floodFor+time.Minute)
	defer cancelVictims()
	// Kubelets keep a watch of their node's pods open, as a kubelet does,
	// and LIST them (their relists) every 250 ms.
	watchCtx, stopWatches := context.WithCancel(context.Background())
	defer stopWatches()
	var opened sync.WaitGroup
	var watchesOpen int
	var openMu sync.Mutex
	for i, id := range ids.kubelets {
		c := tgt.client(id)
		path := "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-" + strconv.Itoa(i)
		opened.Add(1)
		go func() {
			req, _ := http.NewRequestWithContext(watchCtx, http.MethodGet, tgt.url+path+"&watch=true&allowWatchBookmarks=true&resourceVersion=0", nil)
			resp, err := c.Do(req)
			if err == nil && resp.StatusCode == http.StatusOK {
				openMu.Lock()
				watchesOpen++
				openMu.Unlock()
			}
			opened.Done()
			if err == nil {
				defer resp.Body.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := resp.Body.Read(buf); err != nil {
						return
					}
				}
			}
		}()
		loop(ctx, &wg, 1, 250*time.Millisecond, func(context.Context, int) {
			kubelets.add(get(victimCtx, c, tgt.url, path+"&resourceVersion=0"))
		})
	}
	opened.Wait()
	// A controller (client-go) reads its namespace consistently and GETs
	// objects from 4 workers (up to 40 reads a second). A consistent read the
	// tier cannot prove fresh in time gets 504 with Retry-After, which
	// client-go retries: what counts is that every call succeeds.
	ctrl, err := tgt.clientset(ids.controller, &controllerHTTP)
	if err != nil {
		t.Fatal(err)
	}
	loop(ctx, &wg, 4, 200*time.Millisecond, func(_ context.Context, w int) {
		ctx := victimCtx
		controller.add(call(func() error {
			_, err := ctrl.CoreV1().ConfigMaps("team-a").List(ctx, metav1.ListOptions{})
			return err
		}))
		controller.add(call(func() error {
			_, err := ctrl.CoreV1().ConfigMaps("team-a").Get(ctx, fmt.Sprintf("settings-%02d", w), metav1.GetOptions{})
			return err
		}))
	})
	// Let the well-behaved run alone for a moment, then flood.
	time.Sleep(time.Second)
	var listClients, watchClients []*http.Client
	for range 4 {
		listClients = append(listClients, tgt.client(ids.flooder))
	}
	for range 2 {
		watchClients = append(watchClients, tgt.client(ids.flooder))
	}
	loop(ctx, &wg, listFlooders, 0, func(ctx context.Context, w int) {
		lists.add(get(ctx, listClients[w%len(listClients)], tgt.url, "/api/v1/configmaps"))
	})
	loop(ctx, &wg, watchListFlooders, 0, func(ctx context.Context, w int) {
		watchLists.add(watchUntilInitialEnd(ctx, watchClients[w%len(watchClients)], tgt.url,
			"/api/v1/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"))
	})
	wg.Wait()
	stopWatches()
	// Requests cut by the end of the flood are not answers.
	for _, r := range []*record{&lists, &watchLists, &kubelets, &controller, &controllerHTTP} {
		r.mu.Lock()
		kept := r.answers[:0]
		for _, a := range r.answers {
			if a.err == nil || ctx.Err() == nil || !strings.Contains(a.err.Error(), "context") {
				kept = append(kept, a)
			}
		}
		r.answers = kept
		r.mu.Unlock()
	}
	res := floodResult{lists: lists.summary(), watchLists: watchLists.summary(), kubelets: kubelets.summary(), controller: controller.summary(), controllerHTTP: controllerHTTP.summary(),
		listTooMany: append(lists.tooMany(), watchLists.tooMany()...), watchesOpen: watchesOpen}
	t.Logf("%s: %s", t.Name(), res)
	return res
}

// checkProtected: the flooder was refused with the apiserver's 429 and
// Retry-After at level global-default; kubelets (level system) and the
// controller (workload-high) were served throughout, with bounded latency
// (a generous bound: the machine is shared).
func checkProtected(t *testing.T, ctx context.Context, kc kubernetes.Interface, r floodResult) {
	t.Helper()
	uid := map[string]string{}
	for _, name := range []string{"global-default", "system", "workload-high"} {
		pl, err := kc.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uid[name] = string(pl.UID)
	}
	for name, want := range map[string]struct {
		s     summary
		level string
	}{"flooder LISTs": {r.lists, "global-default"}, "flooder watch-lists": {r.watchLists, "global-default"}, "kubelets": {r.kubelets, "system"}, "controller": {r.controllerHTTP, "workload-high"}} {
		// Every answer that came back was classified there, including
		// one whose body then failed (its headers name the level).
		if n := want.s.levels[uid[want.level]]; n != want.s.responded {
			t.Errorf("%s: %d of %d answers classified at level %s (%s): %v (first error: %q)", name, n, want.s.responded, want.level, uid[want.level], want.s.levels, want.s.firstOther)
		}
	}
	if len(r.listTooMany) == 0 {
		t.Errorf("the flooder got no 429: %s", r)
	}
	for _, a := range r.listTooMany {
		if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 {
			t.Errorf("a 429 with Retry-After %q", a.retryAfter)
			break
		}
		if a.body != "Too many requests, please try again later.\n" || a.pfFlow == "" || a.pfLevel == "" {
			t.Errorf("a 429 unlike kube-apiserver's: %+v", a)
			break
		}
	}
	if r.watchesOpen != nodes {
		t.Errorf("%d of %d kubelets' watches opened", r.watchesOpen, nodes)
	}
	if r.controllerHTTP.tooMany > 0 {
		t.Errorf("the controller got 429s: %s", r.controllerHTTP)
	}
	for name, s := range map[string]summary{"kubelets": r.kubelets, "controller": r.controller} {
		if s.ok == 0 || s.tooMany > 0 || s.other > 0 || s.errs > 0 {
			t.Errorf("%s were not served throughout: %s (first failure: %s)", name, s, s.firstOther)
		}
		// Generous bounds: the machine is shared. A controller's
		// consistent read may wait out the freshness timeout (3 s), get
		// 504 with Retry-After 1 and succeed on client-go's retry.
		bound := 5 * time.Second
		if name == "controller" {
			bound = 10 * time.Second
		}
		if s.p99 > bound {
			t.Errorf("%s waited: %s", name, s)
		}
	}
}

// checkRejectLog: the tier's log names the flooder and its level, in a
// line or two per minute, not one per 429.
func checkRejectLog(t *testing.T, log string) {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "request rejected by priority and fairness (429)") {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 || len(lines) > 4 {
		t.Fatalf("%d log lines about rejections, want 1 to 4 (a line per user and level per minute): %q", len(lines), lines)
	}
	if !strings.Contains(lines[0], `"user"="flooder"`) || !strings.Contains(lines[0], `"priorityLevel"="global-default"`) {
		t.Errorf("the rejection log line does not name the flooder and its level: %s", lines[0])
	}
	t.Logf("tier log: %s", lines[0])
}

// series matches a Prometheus text line of a rejection counter.
var rejected = regexp.MustCompile(`^apiserver_flowcontrol_rejected_requests_total\{([^}]*)\} (\S+)$`)

// checkMetrics: /metrics shows the rejections by priority level and flow
// schema — the flooder's global-default, nothing for the kubelets' and
// the controller's levels — and the seats its LISTs held after they
// ended.
func checkMetrics(t *testing.T, ids identities, tgt target, pid int, _ *floodResult) {
	t.Helper()
	resp, err := tgt.client(ids.admin).Get(tgt.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := readAll(resp)
	byLevel := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		m := rejected.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		byLevel[m[1]] += v
		t.Logf("%s", line)
	}
	found := false
	for labels, v := range byLevel {
		if strings.Contains(labels, `flow_schema="global-default"`) && strings.Contains(labels, `priority_level="global-default"`) && v > 0 {
			found = true
		}
		for _, protected := range []string{`priority_level="system"`, `priority_level="workload-high"`, `priority_level="node-high"`} {
			if strings.Contains(labels, protected) && v > 0 {
				t.Errorf("rejections at a protected level: {%s} %g", labels, v)
			}
		}
	}
	if !found {
		t.Errorf("no rejections of flow global-default at level global-default on /metrics (pid %d)", pid)
	}
	// The flooder's LISTs that executed kept their seats after they ended
	// (package apf, estimate.go).
	lingered := 0.0
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, `cachetier_priority_and_fairness_lingering_seat_seconds_total{priority_level="global-default"} `); ok {
			lingered, _ = strconv.ParseFloat(v, 64)
		}
	}
	if lingered <= 0 {
		t.Errorf("no lingering seat-seconds at level global-default on /metrics (pid %d)", pid)
	}
	// The flooder's full LISTs ran on threads of lower priority (package
	// bulkthread), every one lowered: CI runs as root, and raising a
	// thread's nice value needs no privilege anyway.
	bulk := bulkRequests(body)
	if bulk["lowered"] <= 0 || bulk["failed"] > 0 {
		t.Errorf("bulk requests on /metrics (pid %d): %v, want some lowered and none failed", pid, bulk)
	}
	checkSeatCPU(t, body, pid)
	for _, family := range []string{"apiserver_flowcontrol_current_inqueue_requests", "apiserver_flowcontrol_nominal_limit_seats", "apiserver_flowcontrol_work_estimated_seats", "cachetier_priority_and_fairness_config_synced 1"} {
		if !strings.Contains(body, family) {
			t.Errorf("/metrics has no %s", family)
		}
	}
}

// checkSeatCPU: the CPU per seat of read work the tier charges its LISTs
// by (package seatcpu) is within its bounds, and a standalone tier
// learned it under the flood; a fleet's front has its shards' reports
// (a front's own LISTs under this flood may be too few to learn from).
func checkSeatCPU(t *testing.T, body string, pid int) {
	t.Helper()
	gauges := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		for _, name := range []string{`cachetier_seat_cpu_seconds{kind="list"} `, `cachetier_fleet_shard_seat_cpu_seconds{resource="configmaps"} `} {
			if v, ok := strings.CutPrefix(line, name); ok {
				gauges[name], _ = strconv.ParseFloat(v, 64)
				t.Logf("%s", line)
			}
		}
	}
	own, ok := gauges[`cachetier_seat_cpu_seconds{kind="list"} `]
	if !ok || own < seatcpu.Min.Seconds() || own > seatcpu.Max.Seconds() {
		t.Errorf(`cachetier_seat_cpu_seconds{kind="list"} %g (present: %v) on /metrics (pid %d), want within [%v, %v]`, own, ok, pid, seatcpu.Min, seatcpu.Max)
	}
	shards, front := gauges[`cachetier_fleet_shard_seat_cpu_seconds{resource="configmaps"} `]
	switch {
	case front && (shards < seatcpu.Min.Seconds() || shards > seatcpu.Max.Seconds()):
		t.Errorf("the front's shards report %g s per seat (pid %d), want within [%v, %v]", shards, pid, seatcpu.Min, seatcpu.Max)
	case !front && own == seatcpu.Default.Seconds():
		t.Errorf("the standalone tier (pid %d) still charges the default %v per seat after the flood: nothing learned", pid, seatcpu.Default)
	}
}

func readAll(resp *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 64<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// checkMemory records the process' peak resident memory and checks it
// against a pod's limit with room to spare.
func checkMemory(t *testing.T, what string, pid int, r *floodResult) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			r.peakRSS = kb << 10
		}
	}
	t.Logf("%s: peak resident memory %d MiB", what, r.peakRSS>>20)
	if strings.Contains(what, "without") {
		return // measured, not held to the bound
	}
	if r.peakRSS == 0 || r.peakRSS > podMemoryLimit/2 {
		t.Errorf("%s: peak resident memory %d MiB, want under half the pod limit (%d MiB)", what, r.peakRSS>>20, podMemoryLimit>>21)
	}
}

// compare429 sends the same overload to kube-apiserver and to the tier:
// a user whose FlowSchema (created in the cluster, so both read it) puts
// it at a priority level with one share and no queuing. Both answer 429
// alike: the same body and content type, a Retry-After, and the UIDs of
// the same FlowSchema and PriorityLevelConfiguration objects.
func compare429(t *testing.T, ctx context.Context, kc kubernetes.Interface, ids identities, apiserver, tier target) {
	pl, err := kc.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: fsStrict},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
			NominalConcurrencyShares: ptr.To[int32](1), LendablePercent: ptr.To[int32](0), BorrowingLimitPercent: ptr.To[int32](0),
			LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := kc.FlowcontrolV1().FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: fsStrict},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: fsStrict}, MatchingPrecedence: 500,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:         []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: ids.strict.name}}},
				ResourceRules:    []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, ClusterScope: true, Namespaces: []string{"*"}}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
			}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first429 := func(tgt target) (answer, bool) {
		// Until both servers have read the new configuration, the user's
		// requests are global-default's: retry the burst for a while.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var rec record
			var wg sync.WaitGroup
			bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			clients := []*http.Client{tgt.client(ids.strict), tgt.client(ids.strict)}
			for w := range 60 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rec.add(get(bctx, clients[w%2], tgt.url, "/api/v1/configmaps"))
				}()
			}
			wg.Wait()
			cancel()
			for _, a := range rec.tooMany() {
				if a.pfFlow == string(fs.UID) {
					return a, true
				}
			}
		}
		return answer{}, false
	}
	want, ok := first429(apiserver)
	if !ok {
		t.Fatal("kube-apiserver never answered 429 to a flood at a one-share priority level without queuing")
	}
	got, ok := first429(tier)
	if !ok {
		t.Fatal("the tier never answered 429 to a flood at a one-share priority level without queuing")
	}
	t.Logf("kube-apiserver: 429 %q Retry-After %s %s; tier: 429 %q Retry-After %s %s", want.body, want.retryAfter, want.contentType, got.body, got.retryAfter, got.contentType)
	if got.body != want.body || got.contentType != want.contentType || got.pfFlow != want.pfFlow || got.pfLevel != want.pfLevel || got.pfLevel != string(pl.UID) {
		t.Errorf("the tier's 429 %+v, kube-apiserver's %+v", got, want)
	}
	for _, a := range []answer{want, got} {
		if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 {
			t.Errorf("Retry-After %q", a.retryAfter)
		}
	}
	_ = kc.FlowcontrolV1().FlowSchemas().Delete(ctx, fsStrict, metav1.DeleteOptions{})
	_ = kc.FlowcontrolV1().PriorityLevelConfigurations().Delete(ctx, fsStrict, metav1.DeleteOptions{})
}

// checkDangling: a FlowSchema naming a priority level that does not exist
// gets its Dangling condition from kube-apiserver; the tier, which may not
// write FlowSchema status, does not retry hot nor fill its log.
func checkDangling(t *testing.T, ctx context.Context, kc kubernetes.Interface, tierLog string) {
	const name = "flood-dangling"
	_, err := kc.FlowcontrolV1().FlowSchemas().Create(ctx, &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: flowcontrolv1.FlowSchemaSpec{PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "no-such-level"}, MatchingPrecedence: 600,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:      []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindUser, User: &flowcontrolv1.UserSubject{Name: "nobody"}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, Namespaces: []string{"*"}}},
			}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer kc.FlowcontrolV1().FlowSchemas().Delete(ctx, name, metav1.DeleteOptions{})
	deadline := time.Now().Add(30 * time.Second)
	for {
		fs, err := kc.FlowcontrolV1().FlowSchemas().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(fs.Status.Conditions) > 0 && fs.Status.Conditions[0].Type == flowcontrolv1.FlowSchemaConditionDangling && fs.Status.Conditions[0].Status == flowcontrolv1.ConditionTrue {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver did not mark %s dangling: %+v", name, fs.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Longer than the controller's first backoffs (200 ms doubling).
	time.Sleep(10 * time.Second)
	b, err := os.ReadFile(tierLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, name) {
			lines++
			t.Logf("tier log: %s", line)
		}
	}
	if lines > 3 {
		t.Errorf("the tier logged %d lines about %s's status", lines, name)
	}
	t.Logf("the tier logged %d lines about %s's status (kube-apiserver wrote its Dangling condition)", lines, name)
}

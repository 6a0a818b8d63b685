package observability

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/dashboard"
	"github.com/cachetier/cachetier/hack/nodeinstall"
	"github.com/cachetier/cachetier/hack/promapi"
	"github.com/cachetier/cachetier/internal/alerts"
)

// TestDashboardsAndAlerts: with a workload writing and reading through the
// tier, five faults make five alerts fire through the operator-managed
// Prometheus, and each resolves once its cause is gone:
//   - the operator stopped while the fleet's RBAC is revoked and its
//     serving certificate is about to expire: CachetierUpstreamAuthErrors
//     and CachetierCertificateExpiringSoon (the operator back repairs
//     both);
//   - the shards cut off the apiserver in the node's network:
//     CachetierFreshnessTimeouts (consistent reads answered 504);
//   - a shard without any replica (the node cordoned, the shard's pods
//     deleted, so they cannot come back) for longer than 10 min:
//     CachetierShardNoReadyReplica, then CachetierProfileDegraded (the
//     node uncordoned brings them back).
//
// On the healthy fleet and while the shard is down, every panel query of
// every shipped dashboard, with its variables set to the values
// Prometheus has, returns series whose values are all finite. Afterwards
// the panels are drawn from the whole run.
func TestDashboardsAndAlerts(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	p, err := e.in.Profile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Every fleet pod and every manager replica (the one not leading
	// serves controller-runtime's metrics too).
	mgr, err := e.in.Client.AppsV1().Deployments(nodeinstall.OperatorNamespace).Get(ctx, nodeinstall.ManagerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := int(p.Spec.Shards*p.Spec.ReplicasPerShard+p.Spec.FrontReplicas) + int(*mgr.Spec.Replicas)
	start := time.Now()
	targets := e.waitTargets(t, want, 3*time.Minute)
	t.Logf("%d targets up %s after Prometheus started", len(targets), time.Since(start).Round(time.Second))
	for _, tg := range targets {
		t.Logf("  %s %s", tg.Labels["job"], tg.ScrapeURL)
	}
	e.checkMonitorsAccepted(t)
	e.waitStatusFromEveryReplica(t, p.Name, int(*mgr.Spec.Replicas), 2*time.Minute)
	w := startWorkload(t, e, p.Status.ServerURL)
	e.checkRulesHealthy(t)
	e.waitWorkloadScraped(t, 2*time.Minute)
	// The panels are checked and drawn from here: before the workload's
	// first requests reached the fleet, a ratio of request counters (the
	// authn connection cache's hit ratio) is 0/0 at every step where
	// Prometheus already had two flat samples — a run whose workload
	// started later than the second scrape failed on that alone.
	workloadSeen := time.Now()
	t.Logf("workload so far: %s", w)
	// Every panel of the cache-server dashboard shows numbers on a healthy
	// fleet under the workload (the operator's reconcile latencies have
	// nothing to show while it has nothing to reconcile: they are
	// checked while it works, with the shard down)...
	if !t.Run("dashboards healthy", func(t *testing.T) { e.checkDashboards(t, "cachetier-dashboard.json") }) {
		t.Fatalf("dashboards of a healthy fleet; workload: %s", w)
	}

	// The dashboards are checked while the shard is down and its alert
	// pending: the rates' 5 min windows hold the healthy run before the
	// kill and the errors after it, and the alert's 2 min `for:` is spent
	// anyway.
	// The operator stopped, the fleet's RBAC revoked and its certificate
	// about to expire: both alerts fire; the operator back, both resolve
	// (the auth alert's 5 min window runs out during the shard kill).
	var faults *operatorFaults
	if !t.Run("operator faults", func(t *testing.T) { faults = e.breakWhileOperatorStopped(t, p) }) {
		t.Fatalf("the RBAC and certificate alerts failed; workload: %s", w)
	}
	if !t.Run("operator back", faults.restore) {
		t.FailNow()
	}
	// The shards cut off the apiserver: consistent reads time out.
	var cut *apiserverCut
	if !t.Run("apiserver unreachable", func(t *testing.T) { cut = e.cutShardsOffAPIServer(t, p) }) {
		t.Fatalf("the freshness alert failed; workload: %s", w)
	}
	// With the fleet's RBAC gone, and then the apiserver, no watch-list
	// completed and no change reached a watch: wait until Prometheus saw
	// both again, or the watch-list and delivery panels' 5 min windows
	// would be empty while the shard is down (a down shard stops both).
	e.waitWorkloadScraped(t, 3*time.Minute)
	// ...and while a shard is down.
	dashboards := func(t *testing.T) {
		t.Run("dashboards shard down", func(t *testing.T) { e.checkDashboards(t) })
	}
	degraded := func(a promapi.Alert) bool {
		return a.Labels["alertname"] == alerts.ProfileDegraded && a.Labels["profile"] == p.Name
	}
	var killed time.Time
	whileDown := func(t *testing.T, since time.Time) {
		killed = since
		// 10 min `for:` from the first evaluation that saw Degraded.
		a := e.waitAlert(t, "firing", 13*time.Minute, degraded)
		t.Logf("%s firing %s after the kill: %v, %q", alerts.ProfileDegraded, time.Since(killed).Round(time.Second), a.Labels, a.Annotations["description"])
		// The other shard is healthy: its quiet resources' consistent
		// reads fail on the down shard before they prove its progress,
		// so its applied RV follows the apiserver's only at bookmarks,
		// which must not read as lagging.
		all, err := e.prom.Alerts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range all {
			if a.Labels["alertname"] == alerts.FleetLagging && a.State == "firing" {
				t.Errorf("%s firing with the apiserver reachable: %v, %q", alerts.FleetLagging, a.Labels, a.Annotations["description"])
			}
		}
	}
	shardAlerts := t.Run("shard alerts", func(t *testing.T) {
		e.killShard(t, p.Status.Shards[0].Name, int(p.Spec.ReplicasPerShard), dashboards, whileDown)
	})
	e.logManagerRestarts(t)
	if !shardAlerts {
		t.Fatalf("the shard alerts or the dashboards failed; workload: %s", w)
	}
	if !t.Run("degraded resolved", func(t *testing.T) {
		e.waitAlert(t, "", 4*time.Minute, degraded)
		t.Logf("%s resolved within %s after the kill", alerts.ProfileDegraded, time.Since(killed).Round(time.Second))
	}) {
		t.FailNow()
	}
	if !t.Run("apiserver reachable", cut.waitResolved) {
		t.FailNow()
	}
	if !t.Run("operator faults resolved", faults.waitResolved) {
		t.FailNow()
	}
	t.Run("render", func(t *testing.T) { e.renderDashboards(t, workloadSeen) })
	e.checkRulesHealthy(t)
	t.Logf("workload: %s", w)
	if w.writes.Load() == 0 || w.reads.Load() == 0 || w.watchEvents.Load() == 0 || w.watchLists.Load() == 0 {
		t.Fatalf("the workload did not run: %s", w)
	}
}

// checkRulesHealthy: Prometheus loaded every shipped alerting rule and
// evaluates each without error.
func (e *env) checkRulesHealthy(t *testing.T) {
	t.Helper()
	rules, err := e.prom.Rules(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != e.ruleCount {
		t.Fatalf("prometheus loaded %d rules, the rule files hold %d", len(rules), e.ruleCount)
	}
	for _, r := range rules {
		if r.Health == "err" || r.LastError != "" {
			t.Errorf("rule %s (%s): health %s: %s", r.Name, filepath.Base(r.File), r.Health, r.LastError)
		}
	}
}

// waitWorkloadScraped waits until Prometheus has scraped the workload's
// effect on the fronts twice (rates need two samples): LISTs served,
// watch-lists that reached their initial-events-end bookmark and changes
// delivered to the long watch, so the panels have a healthy stretch before
// the shard is killed. The apiserver's cut before it lasts longer than the
// panels' 5 min window and stops all three; a down shard stops the last two
// again (the front cannot order a change it has not seen from every
// shard), so a panel that saw none since the cut shows nothing then. CI
// once killed the shard 18 s after the shards reached the apiserver again,
// with watch-lists complete again but no delivery to the reopened long
// watch scraped yet: the delivery latency panel stayed empty.
func (e *env) waitWorkloadScraped(t *testing.T, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	exprs := []string{
		`sum(rate(cachetier_requests_total{verb="list"}[5m])) > 0`,
		`sum(rate(cachetier_watch_list_initial_events_seconds_count[5m])) > 0`,
		`sum(rate(cachetier_watch_delivery_seconds_count[5m])) > 0`,
	}
	for _, expr := range exprs {
		e.waitQuery(t, expr, start.Add(timeout), func(s []promapi.Sample) bool { return len(s) > 0 })
	}
	t.Logf("prometheus saw the workload %s after it started", time.Since(start).Round(time.Second))
}

// logManagerRestarts says which operator replica leads and how each
// replica's container last ended if it restarted (a leader that cannot
// renew its lease exits): a leader change during the faults is what the
// alerts' aggregation over replicas is for.
func (e *env) logManagerRestarts(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if leader, err := e.in.Leader(ctx); err == nil {
		t.Logf("operator lease held by pod %s", leader.Name)
	}
	pods, err := e.in.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: nodeinstall.ManagerSelector})
	if err != nil {
		t.Logf("operator pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			t.Logf("operator pod %s: container %s restarted %d times%s", p.Name, c.Name, c.RestartCount, lastEnded(c))
		}
	}
}

// waitStatusFromEveryReplica waits until Prometheus has the profile's
// conditions from each of the operator's replicas, the one not leading
// too: the alerts aggregate over them, so that a leader change in a
// `for:` does not restart it (CI saw one restart the 10 min of
// CachetierProfileDegraded when only the leader exported them).
func (e *env) waitStatusFromEveryReplica(t *testing.T, profile string, replicas int, timeout time.Duration) {
	t.Helper()
	expr := fmt.Sprintf(`count by (profile) (cachetier_profile_condition{profile=%q, type="Available"})`, profile)
	e.waitQuery(t, expr, time.Now().Add(timeout), func(s []promapi.Sample) bool { return len(s) == 1 && int(s[0].Value) == replicas })
	t.Logf("profile %s's conditions exported by all %d operator replicas", profile, replicas)
}

// waitQuery polls expr until ok holds for its result, failing at deadline
// (or as soon as Prometheus restarted) with the last result.
func (e *env) waitQuery(t *testing.T, expr string, deadline time.Time, ok func([]promapi.Sample) bool) {
	t.Helper()
	for {
		s, err := e.prom.Query(context.Background(), expr)
		if err == nil && ok(s) {
			return
		}
		e.promRestarted(t)
		if time.Now().After(deadline) {
			t.Fatalf("prometheus: %s is %v (err %v) at the deadline", expr, s, err)
		}
		time.Sleep(2 * time.Second)
	}
}

// killShard makes shard sts lose every replica for longer than the alert's
// `for:` and checks the alert's whole life through /api/v1/alerts; while
// the alert is pending it calls whilePending, once it fires whileDown
// (given the time of the kill), and then brings the replicas back.
func (e *env) killShard(t *testing.T, sts string, replicas int, whilePending func(*testing.T), whileDown func(*testing.T, time.Time)) {
	ctx := context.Background()
	kc := e.in.Client
	node := func(unschedulable bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, unschedulable)
		if _, err := kc.CoreV1().Nodes().Patch(ctx, cluster.NodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Cordoned, the node keeps its pods but takes no new ones: the
	// shard's deleted pods stay Pending.
	node(true)
	uncordoned := false
	defer func() {
		if !uncordoned {
			node(false)
		}
	}()
	killed := time.Now()
	for i := 0; i < replicas; i++ {
		name := fmt.Sprintf("%s-%d", sts, i)
		if err := kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	t.Logf("node cordoned, %d pods of shard %s deleted", replicas, sts)
	match := func(a promapi.Alert) bool {
		return a.Labels["alertname"] == alerts.ShardNoReadyReplica && a.Labels["shard"] == sts
	}
	pending := e.waitAlert(t, "pending", 3*time.Minute, match)
	t.Logf("%s pending %s after the kill", alerts.ShardNoReadyReplica, time.Since(killed).Round(time.Second))
	whilePending(t)
	firing := e.waitAlert(t, "firing", 4*time.Minute, match)
	t.Logf("%s firing %s after the kill (active since %s, pending seen at %s): labels %v, description %q",
		alerts.ShardNoReadyReplica, time.Since(killed).Round(time.Second), firing.ActiveAt.Format(time.TimeOnly), pending.ActiveAt.Format(time.TimeOnly), firing.Labels, firing.Annotations["description"])
	if firing.Labels["severity"] != "critical" || !strings.HasSuffix(firing.Annotations["runbook_url"], "#"+strings.ToLower(alerts.ShardNoReadyReplica)) {
		t.Errorf("firing alert: labels %v annotations %v", firing.Labels, firing.Annotations)
	}
	// Only that shard: the other shard kept its replicas.
	all, err := e.prom.Alerts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range all {
		t.Logf("  alert %s %v", a.State, a.Labels)
		if a.Labels["alertname"] == alerts.ShardNoReadyReplica && a.Labels["shard"] != sts {
			t.Errorf("%s for shard %s, which was not touched", alerts.ShardNoReadyReplica, a.Labels["shard"])
		}
	}

	whileDown(t, killed)
	node(false)
	uncordoned = true
	recovered := time.Now()
	e.waitAlert(t, "", 4*time.Minute, match)
	t.Logf("%s resolved %s after the node took pods again", alerts.ShardNoReadyReplica, time.Since(recovered).Round(time.Second))
	// ALERTS has no series for it any more either.
	s, err := e.prom.Query(ctx, fmt.Sprintf(`ALERTS{alertname=%q, shard=%q}`, alerts.ShardNoReadyReplica, sts))
	if err != nil || len(s) != 0 {
		t.Fatalf("ALERTS after resolving: %v %v", s, err)
	}
}

// waitAlert polls /api/v1/alerts until an alert matching match is in
// state, or, with state "", until none matches (resolved).
func (e *env) waitAlert(t *testing.T, state string, timeout time.Duration, match func(promapi.Alert) bool) promapi.Alert {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		all, err := e.prom.Alerts(context.Background())
		if err == nil {
			found := false
			for _, a := range all {
				if match(a) {
					found = true
					if a.State == state {
						return a
					}
				}
			}
			if state == "" && !found {
				return promapi.Alert{}
			}
		}
		e.promRestarted(t)
		if time.Now().After(deadline) {
			t.Fatalf("alert not %q after %s (err %v): %v", state, timeout, err, all)
		}
		time.Sleep(2 * time.Second)
	}
}

// checkDashboards evaluates every panel query of the dashboards in
// config/grafana (only those named, if any) through /api/v1/query with the
// dashboard's variables set to all the values their label_values query
// finds. A query is retried for a minute: rates need two scrapes of a
// series.
func (e *env) checkDashboards(t *testing.T, only ...string) {
	ctx := context.Background()
	files, err := filepath.Glob(filepath.Join(e.root, "config", "grafana", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	for _, f := range files {
		if len(only) > 0 && !slices.Contains(only, filepath.Base(f)) {
			continue
		}
		d, err := dashboard.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		values := e.variableValues(t, d)
		type query struct{ panel, expr, why string }
		var pending []query
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				q, err := dashboard.Substitute(tg.Expr, values)
				if err != nil {
					t.Fatal(err)
				}
				pending = append(pending, query{panel: p.Title, expr: q})
			}
		}
		total := len(pending)
		// Rates need two scrapes of a series that just appeared: the
		// empty ones are asked again for a minute.
		deadline := time.Now().Add(time.Minute)
		for {
			var empty []query
			for _, q := range pending {
				s, err := e.prom.Query(ctx, q.expr)
				if err != nil {
					t.Errorf("%s / %s: %v", d.Title, q.panel, err)
					continue
				}
				if bad := notFinite(s); len(s) == 0 || bad != "" {
					q.why = "no series"
					if len(s) > 0 {
						q.why = bad
					}
					empty = append(empty, q)
					continue
				}
				// Only with -v: on a failure, ~80 lines of panels that
				// answered pushed the ones that did not out of the part of
				// the output CI shows.
				if testing.Verbose() {
					t.Logf("%s / %s: %d series, e.g. %v = %g", d.Title, q.panel, len(s), s[0].Metric, s[0].Value)
				}
			}
			pending = empty
			if len(pending) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Second)
		}
		if len(pending) > 0 {
			var desc []string
			for _, q := range pending {
				desc = append(desc, fmt.Sprintf("%q: %s: %s", q.panel, q.why, q.expr))
			}
			t.Errorf("%s: %d of %d panel queries returned no series or a value that is not finite:\n%s", d.Title, len(pending), total, strings.Join(desc, "\n"))
		} else {
			t.Logf("%s: all %d panel queries returned series, every value finite", d.Title, total)
		}
	}
}

// notFinite describes the first sample whose value is NaN or infinite (a
// ratio of zero rates, a quantile of no observations: a panel that shows
// nothing), or is "" when every value is a number.
func notFinite(s []promapi.Sample) string {
	for _, x := range s {
		if math.IsNaN(x.Value) || math.IsInf(x.Value, 0) {
			return fmt.Sprintf("%v = %g", x.Metric, x.Value)
		}
	}
	return ""
}

// variableValues sets each query variable of d to all the values its
// label_values query finds in Prometheus, formatted as Grafana does for
// "All" of a multi-value variable picked value by value; the data source
// variable appears in no query.
func (e *env) variableValues(t *testing.T, d *dashboard.Dashboard) map[string]string {
	t.Helper()
	values := map[string]string{}
	for _, v := range d.Variables {
		if v.Type != "query" {
			values[v.Name] = ""
			continue
		}
		sel, label, err := dashboard.LabelValuesQuery(v.Query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.prom.LabelValues(context.Background(), label, sel)
		if err != nil || len(got) == 0 {
			t.Fatalf("%s: variable %s (%s): %v %v", d.Title, v.Name, v.Query, got, err)
		}
		sort.Strings(got)
		values[v.Name] = dashboard.RegexValue(got)
		t.Logf("%s: $%s = %s", d.Title, v.Name, values[v.Name])
	}
	return values
}

package integration

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/internal/alerts"
	"github.com/cachetier/cachetier/internal/metriclint"
)

// kubectlOut runs the control plane's kubectl and returns its stdout.
func kubectlOut(t *testing.T, h *harness, args ...string) string {
	t.Helper()
	stdout, stderr, err := h.env.ControlPlane.KubeCtl().Run(args...)
	out, _ := io.ReadAll(stdout)
	if err != nil {
		errOut, _ := io.ReadAll(stderr)
		t.Fatalf("kubectl %s: %v\n%s\n%s", strings.Join(args, " "), err, out, errOut)
	}
	return string(out)
}

// table splits kubectl's table output into rows of fields.
func table(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

// testKubectlGetHealthy: `kubectl get cacheprofiles` tells a healthy
// profile at a glance, from the columns the CRD declares.
func testKubectlGetHealthy(t *testing.T, h *harness) {
	out := kubectlOut(t, h, "get", "cacheprofiles")
	t.Logf("kubectl get cacheprofiles:\n%s", out)
	rows := table(out)
	if want := []string{"NAME", "SHARDS", "READY", "FRONT", "AVAILABLE", "DEGRADED", "AGE"}; len(rows) != 2 || !slices.Equal(rows[0], want) {
		t.Fatalf("header %v, want %v", rows[0], want)
	}
	if want := []string{"fleet", "2", "2/2", "2/2", "True", "False"}; len(rows[1]) != 7 || !slices.Equal(rows[1][:6], want) {
		t.Errorf("row %v, want %v and an age", rows[1], want)
	}
	wide := table(kubectlOut(t, h, "get", "cacheprofiles", "-o", "wide"))
	if want := []string{"NAME", "SHARDS", "READY", "FRONT", "AVAILABLE", "DEGRADED", "REASON", "SERVER", "AGE"}; !slices.Equal(wide[0], want) {
		t.Errorf("wide header %v, want %v", wide[0], want)
	}
	if len(wide) != 2 || len(wide[1]) != 9 || wide[1][6] != "AsExpected" || !strings.HasSuffix(wide[1][7], "/apis/fleet.cache.cachetier.io/v1alpha1/watch") {
		t.Errorf("wide row %v", wide[1])
	}
}

// testKubectlDegraded: with a shard down, the columns say so and
// `kubectl describe` shows the conditions with what to look at and the
// Warning event of the transition.
func testKubectlDegraded(t *testing.T, h *harness) {
	rows := table(kubectlOut(t, h, "get", "cacheprofiles", "-o", "wide"))
	if want := []string{"fleet", "2", "1/2", "2/2", "False", "True", "ShardUnready"}; len(rows) != 2 || !slices.Equal(rows[1][:7], want) {
		t.Errorf("row %v, want prefix %v", rows[1], want)
	}
	var out string
	eventually(t, 10*time.Second, "describe shows the event", func() error {
		out = kubectlOut(t, h, "describe", "cacheprofile", profileName)
		if !strings.Contains(out, "DegradedTrue") {
			return fmt.Errorf("no DegradedTrue event in\n%s", out)
		}
		return nil
	})
	t.Logf("kubectl describe cacheprofile fleet:\n%s", out)
	for _, want := range []string{
		"Message:               shards with unready replicas: fleet-shard-1 (0/2 ready) (look at: kubectl -n cachetier-system describe statefulset fleet-shard-1, then the pods' events and logs)",
		"Reason:                ShardUnready",
		"Reason:                ShardsUnavailable",
		"Type:                  Degraded",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks %q", want)
		}
	}
	events := out[strings.Index(out, "Events:"):]
	var warning string
	for _, l := range strings.Split(events, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "Warning" && f[1] == "DegradedTrue" {
			warning = l
		}
	}
	if !strings.Contains(warning, "cachetier-operator") || !strings.Contains(warning, "ShardUnready: shards with unready replicas: fleet-shard-1 (0/2 ready)") {
		t.Errorf("no Warning DegradedTrue event from cachetier-operator naming the shard in:\n%s", events)
	}
}

// testOperatorMetricsLint lints what the manager's registry holds once
// the controller has run: controller-runtime's per-controller series exist
// only then.
func testOperatorMetricsLint(t *testing.T, h *harness) {
	problems, err := metriclint.Problems(prometheus.Gatherers{h.metrics, ctrlmetrics.Registry}, controllers.BoundedMetricLabels())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "controller_runtime_reconcile_errors_total" }) {
		t.Error("controller_runtime_reconcile_errors_total (CachetierOperatorReconcileErrors) is not exported")
	}
}

// metricsAre checks series of the reconciler's ProfileMetrics.
func (h *harness) metricsAre(t *testing.T, want map[string]float64) {
	t.Helper()
	eventually(t, 10*time.Second, "profile metrics", func() error {
		got, err := gatherSeries(h)
		if err != nil {
			return err
		}
		for series, v := range want {
			if g, ok := got[series]; !ok || g != v {
				return fmt.Errorf("%s = %v (present %v), want %v; have %v", series, g, ok, v, got)
			}
		}
		return nil
	})
}

func gatherSeries(h *harness) (map[string]float64, error) {
	mfs, err := h.metrics.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue()
			if m.Counter != nil {
				v = m.GetCounter().GetValue()
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out, nil
}

// testPrometheusRule: once the Prometheus Operator's PrometheusRule CRD
// exists, every profile gets its fleet alerts, and reconciling again
// writes nothing.
func testPrometheusRule(t *testing.T, h *harness) {
	ctx := context.Background()
	installMonitoringCRD(t, h, apiextensionsv1.CustomResourceDefinitionNames{Plural: "prometheusrules", Singular: "prometheusrule", Kind: "PrometheusRule", ListKind: "PrometheusRuleList"})
	want := alerts.FleetRules(alerts.FleetScope{Namespace: workloadNamespace, Profile: profileName})[0].Rules
	eventually(t, 30*time.Second, "prometheusrule", func() error {
		pr := &unstructured.Unstructured{}
		pr.SetAPIVersion("monitoring.coreos.com/v1")
		pr.SetKind("PrometheusRule")
		if err := h.client.Get(ctx, key(workloadNamespace, profileName), pr); err != nil {
			return err
		}
		groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
		if len(groups) != 1 {
			return fmt.Errorf("groups %v", groups)
		}
		rules, _ := groups[0].(map[string]any)["rules"].([]any)
		if len(rules) != len(want) {
			return fmt.Errorf("%d rules, want %d", len(rules), len(want))
		}
		for i, r := range rules {
			if m := r.(map[string]any); m["alert"] != want[i].Alert || m["expr"] != want[i].Expr || m["for"] != nilIfEmpty(want[i].For) {
				return fmt.Errorf("rule %d: %v, want %+v", i, m, want[i])
			}
		}
		if refs := pr.GetOwnerReferences(); len(refs) != 1 || refs[0].Name != profileName {
			return fmt.Errorf("owner references %v", refs)
		}
		return nil
	})
	waitQuiet(t, h)
	before := h.writes.Load()
	for range 3 {
		if _, err := h.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key("", profileName)}); err != nil {
			t.Fatal(err)
		}
	}
	if after := h.writes.Load(); after != before {
		t.Fatalf("%d writes reconciling an unchanged profile with its PrometheusRule, last: %v", after-before, h.lastWrite.Load())
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Package observability proves cachetier's dashboards and alerts as a
// cluster operator runs them: the Prometheus Operator (v0.85.0, its own CRDs
// with full schemas, upstream's RBAC and Deployment) on a real node next to
// cachetier (hack/cluster, hack/nodeinstall), and a Prometheus resource it
// turns into a Prometheus 3 pod that finds cachetier's ServiceMonitors and
// PrometheusRules (the operator-rendered and the shipped ones) by label,
// scrapes the fleet and the manager through Kubernetes service discovery
// and evaluates the alert rules. Every image is built from the module
// proxy by hack/imagebuild.
package observability

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/nodeinstall"
	"github.com/cachetier/cachetier/hack/promapi"
)

const (
	ns      = nodeinstall.OperatorNamespace
	profile = nodeinstall.SampleProfile
)

var (
	serviceMonitorsGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
	prometheusRulesGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}
)

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// env is the node with cachetier installed and a Prometheus scraping it.
type env struct {
	in   *nodeinstall.Installer
	root string
	dir  string
	prom *promapi.Client
	// promPod is the operator's Prometheus pod.
	promPod string
	// ruleCount is how many alerting rules cachetier's PrometheusRules
	// hold.
	ruleCount int
}

// setup starts the node with the monitoring images, installs the
// Prometheus Operator, then cachetier with config/prometheus (its
// ServiceMonitor and PrometheusRule; the operator, finding the CRDs,
// renders a ServiceMonitor and a PrometheusRule per profile), the sample
// data and profile, and finally the Prometheus resource.
func setup(t *testing.T) *env {
	ctx := context.Background()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, dir: t.TempDir()}
	in, opts, err := nodeinstall.StartNode(ctx, root, e.dir, testLog{t}, nodeinstall.MonitoringImages()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Teardown(); err != nil {
			t.Error(err)
		}
	})
	e.in = in
	start := time.Now()
	if err := in.InstallPrometheusOperator(ctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("Prometheus Operator Ready %s after apply --server-side -k (its CRDs, RBAC and Deployment)", time.Since(start).Round(time.Second))
	took, err := in.InstallOperator(ctx, 3*time.Minute, filepath.Join("config", "prometheus"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manager Ready %s after apply -k config/default + config/prometheus", took.Round(time.Second))
	if err := in.Seed(ctx, opts.PauseImage); err != nil {
		t.Fatal(err)
	}
	if _, took, err = in.ApplySample(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("profile %s Available %s after apply -k config/samples", profile, took.Round(100*time.Millisecond))
	e.startPrometheus(t)
	return e
}

// startPrometheus waits for the operator's ServiceMonitor and
// PrometheusRule of the profile, counts the alerting rules of every
// PrometheusRule Prometheus is to load, and creates the Prometheus
// resource.
func (e *env) startPrometheus(t *testing.T) {
	ctx := context.Background()
	dc, err := dynamic.NewForConfig(e.in.Admin)
	if err != nil {
		t.Fatal(err)
	}
	var fleetRule, fleetMonitor *unstructured.Unstructured
	deadline := time.Now().Add(time.Minute)
	for fleetRule == nil || fleetMonitor == nil {
		if fleetRule == nil {
			fleetRule, _ = dc.Resource(prometheusRulesGVR).Namespace(ns).Get(ctx, profile, metav1.GetOptions{})
		}
		if fleetMonitor == nil {
			fleetMonitor, _ = dc.Resource(serviceMonitorsGVR).Namespace(ns).Get(ctx, profile, metav1.GetOptions{})
		}
		if time.Now().After(deadline) {
			t.Fatalf("the operator rendered no PrometheusRule and ServiceMonitor %s/%s within a minute (rule %v, monitor %v)", ns, profile, fleetRule != nil, fleetMonitor != nil)
		}
		time.Sleep(500 * time.Millisecond)
	}
	rules, err := dc.Resource(prometheusRulesGVR).List(ctx, metav1.ListOptions{LabelSelector: nodeinstall.MonitorLabelSelector})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rules.Items {
		e.ruleCount += alertingRules(t, r.Object)
		names = append(names, r.GetNamespace()+"/"+r.GetName())
	}
	if len(rules.Items) != 2 {
		t.Fatalf("PrometheusRules of cachetier: %v, want the operator's for %s and config/prometheus' (alerts.yaml)", names, profile)
	}
	t.Logf("PrometheusRules %v: %d alerting rules as shipped (for: unchanged)", names, e.ruleCount)
	p, err := e.in.StartPrometheus(ctx, "15s", 3*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%s", err, e.promLogs())
	}
	e.prom, e.promPod = promapi.New(p.URL), p.Pod
	t.Logf("Prometheus %s (operator-managed, pod %s/%s) at %s", p.Version, nodeinstall.MonitoringNamespace, p.Pod, p.URL)
	if b, err := e.in.Cluster.RunKubectl(ctx, e.in.Cluster.AdminKubeconfig, "-n", nodeinstall.MonitoringNamespace, "get", "secret", "prometheus-"+nodeinstall.PrometheusName, "-o", "jsonpath={.data.prometheus\\.yaml\\.gz}"); err == nil {
		t.Logf("the operator's configuration secret holds %d bytes (gzip, base64)", len(b))
	}
}

// promLogs is the tail of the Prometheus pod's and the Prometheus
// Operator's logs, for failures.
func (e *env) promLogs() string {
	ctx := context.Background()
	var b strings.Builder
	for _, args := range [][]string{
		{"logs", "-l", "prometheus=" + nodeinstall.PrometheusName, "--all-containers", "--tail=20", "--prefix"},
		{"logs", "-l", nodeinstall.PromOperatorSelector, "--tail=20"},
	} {
		out, err := e.in.Cluster.RunKubectl(ctx, e.in.Cluster.AdminKubeconfig, append([]string{"-n", nodeinstall.MonitoringNamespace}, args...)...)
		fmt.Fprintf(&b, "kubectl %s (err %v):\n%s\n", strings.Join(args, " "), err, out)
	}
	return b.String()
}

// whyRestarted says how container c ended last time (OOMKilled, an exit
// code, or 137 after the kubelet's liveness kill), with the pod's events
// (which name failed probes) and that container's last lines before it.
func (e *env) whyRestarted(c corev1.ContainerStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "container %s%s\n", c.Name, lastEnded(c))
	ctx := context.Background()
	for _, args := range [][]string{
		{"get", "events", "--field-selector", "involvedObject.name=" + e.promPod, "--sort-by=.lastTimestamp"},
		{"logs", e.promPod, "-c", c.Name, "--previous", "--tail=30"},
	} {
		out, err := e.in.Cluster.RunKubectl(ctx, e.in.Cluster.AdminKubeconfig, append([]string{"-n", nodeinstall.MonitoringNamespace}, args...)...)
		fmt.Fprintf(&b, "kubectl %s (err %v):\n%s\n", strings.Join(args, " "), err, out)
	}
	return b.String()
}

// lastEnded is ", last ended …" with how container c's previous run ended
// (reason such as OOMKilled or Error, exit code — 137 after a kill —
// times and message), or "" if it has not ended before.
func lastEnded(c corev1.ContainerStatus) string {
	term := c.LastTerminationState.Terminated
	if term == nil {
		return ""
	}
	return fmt.Sprintf(", last ended: reason %s, exit code %d, signal %d, %s to %s, message %q",
		term.Reason, term.ExitCode, term.Signal, term.StartedAt.Format(time.TimeOnly), term.FinishedAt.Format(time.TimeOnly), term.Message)
}

// promRestarted fails the test when a container of the Prometheus pod has
// restarted or the pod is gone: later answers would come from a Prometheus
// that lost its state.
func (e *env) promRestarted(t *testing.T) {
	t.Helper()
	pod, err := e.in.Client.CoreV1().Pods(nodeinstall.MonitoringNamespace).Get(context.Background(), e.promPod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("prometheus pod %s: %v\n%s", e.promPod, err, e.promLogs())
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.RestartCount > 0 {
			t.Fatalf("prometheus pod %s: container %s restarted %d times\n%s\n%s", e.promPod, c.Name, c.RestartCount, e.whyRestarted(c), e.promLogs())
		}
	}
}

// alertingRules is how many rules a PrometheusRule's spec.groups hold.
func alertingRules(t *testing.T, obj map[string]any) int {
	t.Helper()
	spec, _ := obj["spec"].(map[string]any)
	groups, _ := spec["groups"].([]any)
	n := 0
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		n += len(rules)
	}
	if n == 0 {
		t.Fatalf("PrometheusRule without rules: %v", obj)
	}
	return n
}

// waitTargets waits until Prometheus scrapes want targets, all up.
func (e *env) waitTargets(t *testing.T, want int, timeout time.Duration) []promapi.Target {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		targets, err := e.prom.Targets(ctx)
		up := 0
		var desc []string
		for _, tg := range targets {
			if tg.Health == "up" {
				up++
			}
			desc = append(desc, fmt.Sprintf("%s %s %s %s", tg.Labels["job"], tg.ScrapeURL, tg.Health, tg.LastError))
		}
		if err == nil && len(targets) == want && up == want {
			return targets
		}
		e.promRestarted(t)
		if time.Now().After(deadline) {
			t.Fatalf("want %d targets up after %s; have (err %v):\n%s\n%s", want, timeout, err, strings.Join(desc, "\n"), e.promLogs())
		}
		time.Sleep(2 * time.Second)
	}
}

// checkMonitorsAccepted: the Prometheus Operator accepted every ServiceMonitor
// of cachetier for the Prometheus (its status binding's Accepted condition,
// written with the StatusForConfigurationResources gate): neither the
// shipped one nor the operator-rendered one was rejected.
func (e *env) checkMonitorsAccepted(t *testing.T) {
	t.Helper()
	dc, err := dynamic.NewForConfig(e.in.Admin)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := dc.Resource(serviceMonitorsGVR).List(context.Background(), metav1.ListOptions{LabelSelector: nodeinstall.MonitorLabelSelector})
		if err != nil {
			t.Fatal(err)
		}
		var problems []string
		for _, sm := range list.Items {
			if why := acceptedBy(sm.Object, nodeinstall.MonitoringNamespace, nodeinstall.PrometheusName); why != "" {
				problems = append(problems, fmt.Sprintf("%s/%s: %s", sm.GetNamespace(), sm.GetName(), why))
			}
		}
		if len(list.Items) == 2 && len(problems) == 0 {
			t.Logf("the Prometheus Operator accepted %d ServiceMonitors of cachetier", len(list.Items))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ServiceMonitors of cachetier (want the manager's and the profile's), not accepted:\n%s\n%s", len(list.Items), strings.Join(problems, "\n"), e.promLogs())
		}
		time.Sleep(2 * time.Second)
	}
}

// acceptedBy is "" when a ServiceMonitor's status binds it to the
// Prometheus namespace/name with Accepted=True, else what it says.
func acceptedBy(obj map[string]any, namespace, name string) string {
	bindings, _, _ := unstructured.NestedSlice(obj, "status", "bindings")
	for _, b := range bindings {
		bm, _ := b.(map[string]any)
		if bm["resource"] != "prometheuses" || bm["namespace"] != namespace || bm["name"] != name {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(bm, "conditions")
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			if cm["type"] == "Accepted" {
				if cm["status"] == "True" {
					return ""
				}
				return fmt.Sprintf("Accepted=%v: %v: %v", cm["status"], cm["reason"], cm["message"])
			}
		}
		return "no Accepted condition"
	}
	return fmt.Sprintf("no status binding to prometheuses %s/%s: %v", namespace, name, bindings)
}

// Package observability proves cachetier's dashboards and alerts on a real
// Prometheus (Debian's prometheus 2.42, run as a process on the host) that
// scrapes a fleet and the operator installed on a real node (hack/cluster,
// hack/nodeinstall), with the scrape configuration the Prometheus Operator
// would generate from the shipped and operator-rendered ServiceMonitors and
// the shipped alert rules loaded as they are. Targets are discovered from
// the node's apiserver with Prometheus' own RBAC-limited identity, through
// HTTP service discovery (promrun.Discovery: Debian's build has no
// Kubernetes SD).
package observability

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/nodeinstall"
	"github.com/cachetier/cachetier/hack/promrun"
)

const (
	ns      = nodeinstall.OperatorNamespace
	profile = nodeinstall.SampleProfile
	// promNamespace holds Prometheus' ServiceAccount, as a cluster's
	// monitoring namespace would.
	promNamespace = "monitoring"
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
	prom *promrun.Server
	// ruleCount is how many alerting rules the rule files hold.
	ruleCount int
}

// setup starts the node, installs the Prometheus Operator's two CRDs (so the
// operator renders its ServiceMonitor and PrometheusRule, as in a cluster
// that runs the Prometheus Operator), the operator, the sample data and
// profile, and starts Prometheus.
func setup(t *testing.T) *env {
	ctx := context.Background()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, dir: t.TempDir()}
	in, opts, err := nodeinstall.StartNode(ctx, root, e.dir, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Teardown(); err != nil {
			t.Error(err)
		}
	})
	e.in = in
	installMonitoringCRDs(t, e)
	took, err := in.InstallOperator(ctx, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manager Ready %s after apply -k config/default", took.Round(time.Second))
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

// installMonitoringCRDs creates servicemonitors and prometheusrules
// (monitoring.coreos.com/v1) with an open schema: the operator only checks
// that they exist and applies its objects; Prometheus itself is run by the
// test, not by the Prometheus Operator, so nothing else reads them.
func installMonitoringCRDs(t *testing.T, e *env) {
	ac, err := apiextclient.NewForConfig(e.in.Admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []apiextensionsv1.CustomResourceDefinitionNames{
		{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
		{Plural: "prometheusrules", Singular: "prometheusrule", Kind: "PrometheusRule", ListKind: "PrometheusRuleList"},
	} {
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: n.Plural + ".monitoring.coreos.com"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "monitoring.coreos.com", Names: n, Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptr.To(true),
					}},
				}},
			},
		}
		if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(context.Background(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// prometheusIdentity creates Prometheus' ServiceAccount with what a
// Prometheus in the cluster is granted (discovery of Services, Endpoints
// and Pods; GET /metrics, which the manager's metrics endpoint authorizes),
// and returns a client configuration and a token file for it.
func (e *env) prometheusIdentity(t *testing.T) (as *rest.Config, tokenFile string) {
	ctx := context.Background()
	kc := e.in.Client
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: promNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa, err := kc.CoreV1().ServiceAccounts(promNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "endpoints", "pods"}, Verbs: []string{"get", "list", "watch"}},
			{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
		},
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "prometheus"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: promNamespace, Name: sa.Name}},
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := kc.CoreV1().ServiceAccounts(promNamespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokenFile = filepath.Join(e.dir, "prometheus.token")
	if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := e.in.Admin
	ca := cfg.CAData
	if len(ca) == 0 {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	as = &rest.Config{Host: cfg.Host, BearerTokenFile: tokenFile, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	// Discovery lists Endpoints as Kubernetes SD's endpoints role does;
	// the apiserver's deprecation warning about them is noise here.
	as.WarningHandler = rest.NoWarnings{}
	return as, tokenFile
}

// startPrometheus writes the rule files (the operator's PrometheusRule for
// the profile and config/prometheus/alerts.yaml, as shipped: no `for:` is
// changed) and the scrape jobs of the two ServiceMonitors (the operator's
// for the fleet, config/prometheus/monitor.yaml for the manager), and
// starts Prometheus on them.
func (e *env) startPrometheus(t *testing.T) {
	ctx := context.Background()
	as, tokenFile := e.prometheusIdentity(t)
	sdClient, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	sd, err := promrun.ServeDiscovery(sdClient)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sd.Close() })
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
	shippedRule := readManifest(t, filepath.Join(e.root, "config", "prometheus", "alerts.yaml"))
	shippedMonitor := readManifest(t, filepath.Join(e.root, "config", "prometheus", "monitor.yaml"))

	var ruleFiles []string
	for name, obj := range map[string]map[string]any{"fleet-rules.yaml": fleetRule.Object, "operator-rules.yaml": shippedRule} {
		groups, n := ruleGroups(t, obj)
		e.ruleCount += n
		b, err := yaml.Marshal(map[string]any{"groups": groups})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ruleFiles = append(ruleFiles, path)
	}
	t.Logf("rule files: the operator's PrometheusRule %s/%s and config/prometheus/alerts.yaml, %d alerting rules as shipped (for: unchanged)", ns, profile, e.ruleCount)

	var jobs []map[string]any
	for _, obj := range []map[string]any{fleetMonitor.Object, shippedMonitor} {
		sm, err := promrun.FromObject(obj, tokenFile)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, sm.Job(sd.SDConfig(sm.Namespace)))
	}
	// 30 s is the Prometheus Operator's default interval for endpoints
	// that set none (the manager's); the fleet's ServiceMonitor sets its own.
	cfg, err := promrun.Config("30s", "15s", ruleFiles, jobs)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(e.dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("prometheus.yml:\n%s", cfg)
	if e.prom, err = promrun.Start(ctx, cfgPath, e.dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.prom.Stop() })
	t.Logf("prometheus %s at %s", promrun.Binary, e.prom.URL)
}

func readManifest(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(b, &obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return obj
}

// ruleGroups returns a PrometheusRule's spec.groups and how many alerting
// rules they hold.
func ruleGroups(t *testing.T, obj map[string]any) ([]any, int) {
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
	return groups, n
}

// waitTargets waits until Prometheus scrapes want targets, all up.
func (e *env) waitTargets(t *testing.T, want int, timeout time.Duration) []promrun.Target {
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
		if err := e.prom.Exited(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d targets up after %s; have (err %v):\n%s", want, timeout, err, strings.Join(desc, "\n"))
		}
		time.Sleep(2 * time.Second)
	}
}

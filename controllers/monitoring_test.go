package controllers

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cachetier/cachetier/internal/alerts"
)

func TestBuildPrometheusRule(t *testing.T) {
	p := testProfile()
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{PrometheusRule: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.ServiceMonitor != nil {
		t.Error("ServiceMonitor built without its CRD")
	}
	pr := d.PrometheusRule
	if pr == nil || pr.GetAPIVersion() != "monitoring.coreos.com/v1" || pr.GetKind() != "PrometheusRule" ||
		pr.GetName() != p.Name || pr.GetNamespace() != testOpts.Namespace {
		t.Fatalf("PrometheusRule: %v", pr)
	}
	if refs := pr.GetOwnerReferences(); len(refs) != 1 || refs[0].Kind != "CacheProfile" || refs[0].Name != p.Name || refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("owner references: %+v", refs)
	}
	if pr.GetLabels()[LabelManagedBy] != ManagedByValue || pr.GetLabels()[LabelProfile] != p.Name {
		t.Errorf("labels: %v (the manager's cache only sees managed, per-profile objects)", pr.GetLabels())
	}
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if len(groups) != 1 {
		t.Fatalf("groups: %v", groups)
	}
	rules, _ := groups[0].(map[string]any)["rules"].([]any)
	want := alerts.FleetRules(alerts.FleetScope{Namespace: testOpts.Namespace, Profile: p.Name})[0].Rules
	if len(rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(rules), len(want))
	}
	scope := `namespace="` + testOpts.Namespace + `",job=~"` + p.Name + `-(front|shards)"`
	for i, r := range rules {
		m := r.(map[string]any)
		expr, _ := m["expr"].(string)
		if m["alert"] != want[i].Alert || expr != want[i].Expr || !strings.Contains(expr, scope) {
			t.Errorf("rule %d: %v; want %s scoped by %s", i, m, want[i].Alert, scope)
		}
		ann, _ := m["annotations"].(map[string]any)
		if ann["runbook_url"] != alerts.RunbookURL(want[i].Alert) {
			t.Errorf("%s: runbook_url %v", want[i].Alert, ann["runbook_url"])
		}
	}
	// Applied after the workloads, like the ServiceMonitor.
	objs := d.Objects()
	if objs[len(objs)-2] != d.PrometheusRule {
		t.Errorf("PrometheusRule is not applied just before the APIService")
	}
}

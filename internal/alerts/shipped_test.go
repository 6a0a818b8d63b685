package alerts

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite config/prometheus/alerts.yaml from OperatorRules")

// shippedPath is the PrometheusRule installed by `kubectl apply -k
// config/prometheus`, next to the manager's ServiceMonitor.
const shippedPath = "../../config/prometheus/alerts.yaml"

func shippedManifest(t *testing.T) []byte {
	t.Helper()
	obj, err := PrometheusRule("cachetier-operator", "cachetier-system",
		map[string]string{"app.kubernetes.io/name": "cachetier", "app.kubernetes.io/component": "manager", "app.kubernetes.io/part-of": "cachetier"}, OperatorRules())
	if err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	header := "# Generated from internal/alerts.OperatorRules by `go test ./internal/alerts -run TestShippedOperatorRules -update`; do not edit.\n" +
		"# The alerts about each profile's fleet are rendered by the operator into a PrometheusRule per profile.\n"
	return append([]byte(header), b...)
}

// TestShippedOperatorRules: the manifest in config/prometheus is what
// OperatorRules renders, so the promtool tests cover what ships.
func TestShippedOperatorRules(t *testing.T) {
	want := shippedManifest(t)
	if *update {
		if err := os.WriteFile(shippedPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(shippedPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from OperatorRules; run go test ./internal/alerts -run TestShippedOperatorRules -update", shippedPath)
	}
}

// TestEveryAlertHasARunbook: each alert's runbook_url anchor is a section
// of docs/alerts.md (GitHub's anchor of "## Name" is the lower-cased name).
func TestEveryAlertHasARunbook(t *testing.T) {
	doc, err := os.ReadFile("../../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range append(FleetRules(FleetScope{Namespace: "ns", Profile: "p"}), OperatorRules()...) {
		for _, r := range g.Rules {
			if !bytes.Contains(doc, []byte("\n## "+r.Alert+"\n")) {
				t.Errorf("docs/alerts.md has no section %q", r.Alert)
			}
			if r.Annotations["runbook_url"] != RunbookBase+"#"+strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q", r.Alert, r.Annotations["runbook_url"])
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s", r.Alert, a)
				}
			}
		}
	}
}

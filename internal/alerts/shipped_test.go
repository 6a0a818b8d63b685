package alerts

import (
	"bytes"
	"flag"
	"os"
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
		map[string]string{"app.kubernetes.io/name": "cachetier", "app.kubernetes.io/component": "manager"}, OperatorRules())
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

package alerts

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtool runs Debian's promtool (package prometheus, 2.42). A missing
// promtool fails the test: `make test` installs it (make test-deps), and a
// test that skipped would let broken rules ship.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): run `make test-deps` as root, or apt-get install prometheus", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// writeRuleFiles renders the rules the tests in testdata/ load.
func writeRuleFiles(t *testing.T, dir string) {
	t.Helper()
	for name, groups := range map[string][]Group{
		"fleet.rules.yaml":    FleetRules(FleetScope{Namespace: "cachetier-system", Profile: "fleet"}),
		"operator.rules.yaml": OperatorRules(),
	} {
		b, err := RuleFile(groups)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func testFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("testdata/*.test.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in testdata (%v)", err)
	}
	return files
}

func TestPromtoolCheckAndTestRules(t *testing.T) {
	dir := t.TempDir()
	writeRuleFiles(t, dir)
	out := promtool(t, dir, "check", "rules", "fleet.rules.yaml", "operator.rules.yaml")
	t.Log(out)
	var names []string
	for _, f := range testFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	t.Log(promtool(t, dir, append([]string{"test", "rules"}, names...)...))
}

// promtoolTests is the part of promtool's unit test format the coverage
// check reads.
type promtoolTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertFiresAndStaysQuiet: each alert has at least one promtool
// case where it fires and one where it must not.
func TestEveryAlertFiresAndStaysQuiet(t *testing.T) {
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, f := range testFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt promtoolTests
		if err := yaml.Unmarshal(b, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	for _, g := range slices.Concat(FleetRules(FleetScope{Namespace: "ns", Profile: "p"}), OperatorRules()) {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("%s: no promtool case where it fires", r.Alert)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no promtool case where it must not fire", r.Alert)
			}
		}
	}
}

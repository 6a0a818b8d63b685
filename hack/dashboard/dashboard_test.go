package dashboard

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestSubstitute(t *testing.T) {
	got, err := Substitute(`rate(x{job=~"$job", resource=~"${resource}", j=~"$jobs"}[5m])`, map[string]string{"job": "a", "jobs": "(b|c)", "resource": ".*"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `rate(x{job=~"a", resource=~".*", j=~"(b|c)"}[5m])`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if _, err := Substitute(`x{job=~"$job", r=~"$other"}`, map[string]string{"job": "a"}); err == nil || !strings.Contains(err.Error(), "$other") {
		t.Fatalf("a variable without value: err %v", err)
	}
}

func TestRegexValue(t *testing.T) {
	if got := RegexValue([]string{"fleet-front", "a.b"}); got != `(fleet-front|a\.b)` {
		t.Fatal(got)
	}
	if got := RegexValue([]string{"x+"}); got != `x\+` {
		t.Fatal(got)
	}
}

func TestLabelValuesQuery(t *testing.T) {
	sel, label, err := LabelValuesQuery("label_values(cachetier_requests_total{a=\"b\"}, job)")
	if err != nil || sel != `cachetier_requests_total{a="b"}` || label != "job" {
		t.Fatalf("%q %q %v", sel, label, err)
	}
	if _, _, err := LabelValuesQuery("query_result(up)"); err == nil {
		t.Fatal("want an error for a query that is not label_values")
	}
}

// Every shipped dashboard parses, every panel has a query and every
// variable a query this package can resolve.
func TestShippedDashboards(t *testing.T) {
	files, err := filepath.Glob("../../config/grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	for _, f := range files {
		d, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Panels) == 0 {
			t.Errorf("%s: no panels with queries", f)
		}
		values := map[string]string{}
		for _, v := range d.Variables {
			values[v.Name] = "x"
			if v.Type != "query" {
				continue
			}
			if _, _, err := LabelValuesQuery(v.Query); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				if _, err := Substitute(tg.Expr, values); err != nil {
					t.Errorf("%s panel %q: %v", f, p.Title, err)
				}
			}
		}
		t.Logf("%s: %d panels, %d variables", filepath.Base(f), len(d.Panels), len(d.Variables))
	}
}

func TestLegend(t *testing.T) {
	m := map[string]string{"verb": "list", "code": "200"}
	if got := Legend("{{verb}} {{ code }} {{missing}}", m); got != "list 200" {
		t.Fatalf("%q", got)
	}
	if got := Legend("", m); got != "{code=200, verb=list}" {
		t.Fatalf("%q", got)
	}
}

// Package dashboard reads Grafana dashboard JSON (config/grafana) as data:
// its template variables and each panel's PromQL, and substitutes variable
// values the way Grafana does for a Prometheus data source, so tests can
// evaluate every panel's query on a real Prometheus and render it.
package dashboard

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// Dashboard is the part of a dashboard that queries Prometheus.
type Dashboard struct {
	Title     string
	UID       string
	Variables []Variable
	// Panels are the panels with queries, rows' collapsed panels
	// included, in the dashboard's order.
	Panels []Panel
}

// Variable is a template variable.
type Variable struct {
	Name string
	Type string // "datasource", "query", ...
	// Query is a query variable's query, e.g. label_values(metric, label).
	Query      string
	IncludeAll bool
	AllValue   string
	Multi      bool
}

// Panel is one panel and its queries.
type Panel struct {
	ID      int
	Title   string
	Type    string
	Targets []Target
}

// Target is one query of a panel.
type Target struct {
	RefID        string
	Expr         string
	LegendFormat string
}

type rawPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []rawPanel `json:"panels"`
}

type rawDashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			IncludeAll bool            `json:"includeAll"`
			AllValue   string          `json:"allValue"`
			Multi      bool            `json:"multi"`
		} `json:"list"`
	} `json:"templating"`
	Panels []rawPanel `json:"panels"`
}

// Load reads a dashboard file.
func Load(path string) (*Dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// Parse reads dashboard JSON.
func Parse(b []byte) (*Dashboard, error) {
	var raw rawDashboard
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	d := &Dashboard{Title: raw.Title, UID: raw.UID}
	for _, v := range raw.Templating.List {
		q := v.Definition
		// The query is a string in older dashboards, an object with a
		// "query" field in newer ones.
		var s string
		var obj struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &s) == nil && v.Type == "query" && s != "" {
			q = s
		} else if json.Unmarshal(v.Query, &obj) == nil && obj.Query != "" {
			q = obj.Query
		}
		d.Variables = append(d.Variables, Variable{Name: v.Name, Type: v.Type, Query: q, IncludeAll: v.IncludeAll, AllValue: v.AllValue, Multi: v.Multi})
	}
	var walk func([]rawPanel)
	walk = func(ps []rawPanel) {
		for _, p := range ps {
			if len(p.Targets) > 0 {
				panel := Panel{ID: p.ID, Title: p.Title, Type: p.Type}
				for _, t := range p.Targets {
					if strings.TrimSpace(t.Expr) == "" {
						continue
					}
					panel.Targets = append(panel.Targets, Target{RefID: t.RefID, Expr: t.Expr, LegendFormat: t.LegendFormat})
				}
				if len(panel.Targets) > 0 {
					d.Panels = append(d.Panels, panel)
				}
			}
			walk(p.Panels)
		}
	}
	walk(raw.Panels)
	return d, nil
}

var labelValuesRE = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// LabelValuesQuery splits a label_values(selector, label) variable query.
func LabelValuesQuery(q string) (selector, label string, err error) {
	m := labelValuesRE.FindStringSubmatch(q)
	if m == nil {
		return "", "", fmt.Errorf("variable query %q is not label_values(selector, label)", q)
	}
	return m[1], m[2], nil
}

// RegexValue formats the values chosen for a multi-value variable as
// Grafana does inside a PromQL regex matcher: each value regex-escaped,
// several joined as (a|b).
func RegexValue(values []string) string {
	esc := make([]string, len(values))
	for i, v := range values {
		esc[i] = regexp.QuoteMeta(v)
	}
	if len(esc) == 1 {
		return esc[0]
	}
	return "(" + strings.Join(esc, "|") + ")"
}

// Substitute replaces $name and ${name} in expr with values[name]. It
// fails on a variable reference without a value, so a query never reaches
// Prometheus with a literal "$job".
func Substitute(expr string, values map[string]string) (string, error) {
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	// Longest first: $jobs must not be read as $job + "s".
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	out := expr
	for _, n := range names {
		out = strings.ReplaceAll(out, "${"+n+"}", values[n])
		out = strings.ReplaceAll(out, "$"+n, values[n])
	}
	if m := regexp.MustCompile(`\$\{?[a-zA-Z_]\w*`).FindString(out); m != "" {
		return "", fmt.Errorf("query %q: no value for %s", expr, m)
	}
	return out, nil
}

var legendRE = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// Legend names a series as Grafana does with a target's legendFormat
// ({{label}} replaced by the series' value); without a format, by its
// labels.
func Legend(format string, metric map[string]string) string {
	if format == "" {
		keys := make([]string, 0, len(metric))
		for k := range metric {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + "=" + metric[k]
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return strings.TrimSpace(legendRE.ReplaceAllStringFunc(format, func(m string) string {
		return metric[legendRE.FindStringSubmatch(m)[1]]
	}))
}

package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// The Grafana dashboard lives in config/grafana (see its kustomization). It
// sits outside this package's tree, and config/grafana cannot import an
// internal package, so the check lives here and reads the file by path.
const dashboardPath = "../../../config/grafana/cachetier-dashboard.json"

const wantDatasource = "${datasource}"

// Labels Prometheus adds or histograms carry that are on no Desc.
var targetLabels = map[string]bool{"le": true, "instance": true, "job": true, "namespace": true, "pod": true}

type dashPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *dashDatasource `json:"datasource"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		Datasource *dashDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // collapsed rows
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashboard struct {
	SchemaVersion int `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

// recordingRegisterer records every collector registered through it.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
)

// describe returns fully-qualified metric name -> variable labels.
func describe(t *testing.T, cs []prometheus.Collector) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		s := d.String()
		m := descName.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("cannot parse desc %s", s)
		}
		labels := map[string]bool{}
		if l := descLabels.FindStringSubmatch(s); l != nil && l[1] != "" {
			for _, name := range strings.Split(l[1], ",") {
				name = strings.TrimSuffix(strings.TrimPrefix(name, "c("), ")")
				labels[name] = true
			}
		}
		out[m[1]] = labels
	}
	return out
}

func flattenPanels(ps []dashPanel) []dashPanel {
	var out []dashPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flattenPanels(p.Panels)...)
	}
	return out
}

var (
	// cachetierName: the tier's metrics and the priority-and-fairness
	// families it serves (FlowControl).
	cachetierName = regexp.MustCompile(`\b(?:cachetier|apiserver_flowcontrol)_[a-z0-9_]+`)
	runtimeName   = regexp.MustCompile(`\b(?:process|go)_[a-z0-9_]+`)
	byClause      = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	selector      = regexp.MustCompile(`\b((?:cachetier|apiserver_flowcontrol)_[a-z0-9_]+)\{([^}]*)\}`)
	matcherLabel  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// resolve maps a series name used in PromQL to its metric family name
// (histograms expose _bucket, _sum and _count series).
func resolve(name string, known map[string]map[string]bool) (string, bool) {
	if _, ok := known[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if _, ok := known[base]; ok {
				return base, true
			}
		}
	}
	return "", false
}

// aggregated is what the by (...) clause ending at expr[end:] groups: the
// parenthesized argument that follows it (sum by (x) (...)), or the whole
// expression for the other form (sum(...) by (x)), whose argument comes
// before the clause.
func aggregated(expr string, end int) string {
	rest := strings.TrimLeft(expr[end:], " ")
	if !strings.HasPrefix(rest, "(") {
		return expr
	}
	depth := 0
	for i, c := range rest {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return rest[:i+1]
			}
		}
	}
	return rest
}

// flowControlOnDashboard are the FlowControl families that must have a
// panel: what a priority level rejects, queues and makes wait, and what
// requests are charged.
var flowControlOnDashboard = []string{
	"apiserver_flowcontrol_rejected_requests_total",
	"apiserver_flowcontrol_current_inqueue_requests",
	"apiserver_flowcontrol_request_wait_duration_seconds",
	"apiserver_flowcontrol_current_executing_seats",
	"apiserver_flowcontrol_current_limit_seats",
	"apiserver_flowcontrol_work_estimated_seats",
}

func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("parse %s: %v", dashboardPath, err)
	}
	if d.SchemaVersion != 39 {
		t.Errorf("schemaVersion = %d, want 39", d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["resource"] != "query" {
		t.Errorf("template variables %v: want datasource (type datasource) and resource (type query)", vars)
	}

	rec := &recordingRegisterer{Registerer: prometheus.NewRegistry()}
	New(rec)
	cachetier := describe(t, rec.collectors)
	ours := len(cachetier)
	for name, labels := range FlowControl {
		cachetier[name] = map[string]bool{}
		for _, l := range labels {
			cachetier[name][l] = true
		}
	}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	all := describe(t, rec.collectors)
	if ours == 0 {
		t.Fatal("no metrics registered by New")
	}

	used := map[string]bool{}
	ids := map[int]string{}
	for _, p := range flattenPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != wantDatasource {
			t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, wantDatasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != nil && tg.Datasource.UID != wantDatasource {
				t.Errorf("panel %q: target datasource %+v, want uid %s", p.Title, tg.Datasource, wantDatasource)
			}
			var metrics []string
			for _, name := range cachetierName.FindAllString(tg.Expr, -1) {
				base, ok := resolve(name, cachetier)
				if !ok {
					t.Errorf("panel %q: %s is not exported by the cache-server", p.Title, name)
					continue
				}
				used[base] = true
				metrics = append(metrics, base)
			}
			for _, name := range runtimeName.FindAllString(tg.Expr, -1) {
				if _, ok := resolve(name, all); !ok {
					t.Errorf("panel %q: %s is not exported by the Go or process collector", p.Title, name)
				}
			}
			// Labels in by (...) must be on every cachetier metric the
			// aggregation reads.
			for _, m := range byClause.FindAllStringSubmatchIndex(tg.Expr, -1) {
				labels := tg.Expr[m[2]:m[3]]
				for _, label := range strings.Split(labels, ",") {
					label = strings.TrimSpace(label)
					if label == "" || targetLabels[label] {
						continue
					}
					for _, name := range cachetierName.FindAllString(aggregated(tg.Expr, m[1]), -1) {
						if metric, ok := resolve(name, cachetier); ok && !cachetier[metric][label] {
							t.Errorf("panel %q: by (%s): %s has no label %q", p.Title, labels, metric, label)
						}
					}
				}
			}
			// Label matchers in a cachetier selector must name its labels.
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				base, ok := resolve(m[1], cachetier)
				if !ok {
					continue // reported above
				}
				for _, lm := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
					if !targetLabels[lm[1]] && !cachetier[base][lm[1]] {
						t.Errorf("panel %q: %s has no label %q", p.Title, base, lm[1])
					}
				}
			}
		}
	}

	var missing []string
	// Every metric of the tier's own has a panel; of the library's
	// families, those that say a request was refused or waited.
	for name := range cachetier {
		_, library := FlowControl[name]
		if library && !slices.Contains(flowControlOnDashboard, name) {
			continue
		}
		if !used[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics with no dashboard panel (add one to %s): %v", dashboardPath, missing)
	}
}

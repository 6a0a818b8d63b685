package observability

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/cachetier/cachetier/hack/dashboard"
	"github.com/cachetier/cachetier/hack/panelplot"
	"github.com/cachetier/cachetier/hack/promapi"
)

// EnvPNGDir names a directory for the dashboards' pictures (`make
// dashboard-png` sets it); without it they go to the test's temporary
// directory.
const EnvPNGDir = "CACHETIER_DASHBOARD_PNG_DIR"

// renderDashboards draws every panel of each dashboard from the run's
// range queries (from start to now) into <dashboard>.png. Over the whole
// run too, a panel query must have returned data and never a value that
// is not a number (NaN or ±Inf: a quantile or ratio of zero rates that
// Grafana would draw as nothing); the instant checks while healthy and
// while a shard is down ask more (a value now), this asks it of every
// step.
func (e *env) renderDashboards(t *testing.T, start time.Time) {
	ctx := context.Background()
	out := os.Getenv(EnvPNGDir)
	if out == "" {
		out = e.dir
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	step := (end.Sub(start) / 120).Round(time.Second)
	if step < 5*time.Second {
		step = 5 * time.Second
	}
	files, _ := filepath.Glob(filepath.Join(e.root, "config", "grafana", "*.json"))
	for _, f := range files {
		d, err := dashboard.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		values := e.variableValues(t, d)
		var panels []panelplot.Panel
		for _, p := range d.Panels {
			pp := panelplot.Panel{Title: p.Title}
			for _, tg := range p.Targets {
				q, err := dashboard.Substitute(tg.Expr, values)
				if err != nil {
					t.Fatal(err)
				}
				series, err := e.prom.QueryRange(ctx, q, start, end, step)
				if err != nil {
					t.Fatalf("%s / %s: %v", d.Title, p.Title, err)
				}
				if why := rangeProblem(series); why != "" {
					t.Errorf("%s / %s over the run: %s: %s", d.Title, p.Title, why, q)
				}
				for _, s := range series {
					pp.Lines = append(pp.Lines, panelplot.Line{Label: dashboard.Legend(tg.LegendFormat, s.Metric), Times: s.Times, Values: s.Values})
				}
			}
			if !drawable(pp) {
				// Not an error: a quantile over a window without requests
				// is NaN, but a person looking at the picture should know.
				t.Logf("%s / %s: nothing to draw (no finite value in the run)", d.Title, p.Title)
			}
			panels = append(panels, pp)
		}
		b, err := panelplot.PNG(panels, start, 3, 5*vg.Inch, 3*vg.Inch)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(out, strings.TrimSuffix(filepath.Base(f), ".json")+".png")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d panels, %s to %s, step %s → %s (%d KiB)", d.Title, len(panels), start.Format(time.TimeOnly), end.Format(time.TimeOnly), step, path, len(b)/1024)
	}
}

// rangeProblem describes what makes a range query's result a panel that
// shows nothing at some point of the run: no series at all, or a sample
// that is NaN or infinite. It is "" for a good result.
func rangeProblem(series []promapi.Series) string {
	if len(series) == 0 {
		return "no series"
	}
	for _, s := range series {
		for i, v := range s.Values {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Sprintf("%v = %g at %s", s.Metric, v, s.Times[i].Format(time.TimeOnly))
			}
		}
	}
	return ""
}

// drawable reports whether a panel has a finite value to draw.
func drawable(p panelplot.Panel) bool {
	for _, l := range p.Lines {
		for _, v := range l.Values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				return true
			}
		}
	}
	return false
}

func TestRangeProblem(t *testing.T) {
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	ser := func(vs ...float64) promapi.Series {
		s := promapi.Series{Metric: map[string]string{"job": "x"}}
		for i, v := range vs {
			s.Times = append(s.Times, at.Add(time.Duration(i)*time.Minute))
			s.Values = append(s.Values, v)
		}
		return s
	}
	for _, c := range []struct {
		name   string
		series []promapi.Series
		want   string
	}{
		{"no series", nil, "no series"},
		{"numbers, zeros included", []promapi.Series{ser(0, 1.5), ser(0)}, ""},
		{"NaN in the second series", []promapi.Series{ser(1), ser(2, math.NaN())}, "map[job:x] = NaN at 10:01:00"},
		{"+Inf", []promapi.Series{ser(math.Inf(1))}, "map[job:x] = +Inf at 10:00:00"},
	} {
		if got := rangeProblem(c.series); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

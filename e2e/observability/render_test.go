package observability

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/cachetier/cachetier/hack/dashboard"
	"github.com/cachetier/cachetier/hack/panelplot"
)

// EnvPNGDir names a directory for the dashboards' pictures (`make
// dashboard-png` sets it); without it they go to the test's temporary
// directory.
const EnvPNGDir = "CACHETIER_DASHBOARD_PNG_DIR"

// renderDashboards draws every panel of each dashboard from the run's
// range queries (from start to now) into <dashboard>.png.
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

// Package panelplot draws dashboard panels — time series a Prometheus range
// query returned — into one PNG, a grid of small line charts, so that a
// person can look at a run of the dashboards without a Grafana
// (gonum.org/v1/plot).
package panelplot

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Line is one series of a panel.
type Line struct {
	Label  string
	Times  []time.Time
	Values []float64
}

// Panel is one chart.
type Panel struct {
	Title string
	Lines []Line
}

// MaxLines bounds the lines drawn per panel (and so the legend): a panel
// with more draws the first MaxLines and says how many it left out.
const MaxLines = 6

// palette is distinguishable on white.
var palette = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},
	color.RGBA{R: 255, G: 127, B: 14, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255},
	color.RGBA{R: 214, G: 39, B: 40, A: 255},
	color.RGBA{R: 148, G: 103, B: 189, A: 255},
	color.RGBA{R: 140, G: 86, B: 75, A: 255},
}

// PNG draws panels in a grid of cols columns, each cell w×h, x axes in
// seconds from start. NaN and infinite values (a histogram quantile over no
// requests, a division by zero) are gaps.
func PNG(panels []Panel, start time.Time, cols int, w, h vg.Length) ([]byte, error) {
	if len(panels) == 0 || cols < 1 {
		return nil, fmt.Errorf("nothing to draw: %d panels, %d columns", len(panels), cols)
	}
	rows := (len(panels) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for i, p := range panels {
		pl, err := chart(p, start)
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", p.Title, err)
		}
		plots[i/cols][i%cols] = pl
	}
	img := vgimg.New(w*vg.Length(cols), h*vg.Length(rows))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 3, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		for c := range plots[r] {
			if plots[r][c] != nil {
				plots[r][c].Draw(canvases[r][c])
			}
		}
	}
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func chart(p Panel, start time.Time) (*plot.Plot, error) {
	pl := plot.New()
	title := p.Title
	if len(p.Lines) > MaxLines {
		title += fmt.Sprintf(" (%d of %d series)", MaxLines, len(p.Lines))
	}
	pl.Title.Text = title
	pl.Title.TextStyle.Font.Size = vg.Points(9)
	pl.X.Label.Text = "s"
	pl.X.Tick.Label.Font.Size = vg.Points(7)
	pl.Y.Tick.Label.Font.Size = vg.Points(7)
	pl.Legend.TextStyle.Font.Size = vg.Points(6)
	pl.Legend.Top = true
	pl.Add(plotter.NewGrid())
	for i, l := range p.Lines {
		if i == MaxLines {
			break
		}
		// A gap splits the series into separate line segments.
		var segs []plotter.XYs
		var cur plotter.XYs
		for j, v := range l.Values {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				if len(cur) > 0 {
					segs, cur = append(segs, cur), nil
				}
				continue
			}
			cur = append(cur, plotter.XY{X: l.Times[j].Sub(start).Seconds(), Y: v})
		}
		if len(cur) > 0 {
			segs = append(segs, cur)
		}
		for k, s := range segs {
			line, err := plotter.NewLine(s)
			if err != nil {
				return nil, err
			}
			line.Color = palette[i%len(palette)]
			line.Width = vg.Points(1)
			pl.Add(line)
			if k == 0 {
				pl.Legend.Add(clip(l.Label, 48), line)
			}
		}
	}
	return pl, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}

package panelplot

import (
	"bytes"
	"image/png"
	"math"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
)

// The PNG decodes to the grid's size; NaN values and more series than
// MaxLines are drawn without error.
func TestPNG(t *testing.T) {
	start := time.Unix(1000, 0)
	var ts []time.Time
	for i := 0; i < 10; i++ {
		ts = append(ts, start.Add(time.Duration(i)*15*time.Second))
	}
	var many []Line
	for i := 0; i < MaxLines+2; i++ {
		many = append(many, Line{Label: "s", Times: ts, Values: []float64{1, 2, 3, float64(i), 5, 6, 7, 8, 9, 10}})
	}
	panels := []Panel{
		{Title: "gaps", Lines: []Line{{Label: "a", Times: ts, Values: []float64{1, math.NaN(), 3, 4, math.Inf(1), 6, 7, 8, 9, 10}}}},
		{Title: "many", Lines: many},
		{Title: "empty"},
	}
	b, err := PNG(panels, start, 2, 4*vg.Inch, 3*vg.Inch)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	// vgimg draws at 96 dpi by default: 2×4 in wide, 2×3 in high.
	if got := img.Bounds().Dx(); got != 8*96 {
		t.Errorf("width %d px", got)
	}
	if got := img.Bounds().Dy(); got != 6*96 {
		t.Errorf("height %d px", got)
	}
	if _, err := PNG(nil, start, 2, vg.Inch, vg.Inch); err == nil {
		t.Error("no panels: want an error")
	}
}

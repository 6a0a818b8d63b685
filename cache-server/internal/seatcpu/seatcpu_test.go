package seatcpu

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestWork(t *testing.T) {
	if got := Work(10_000, 14<<20); got != 24 {
		t.Errorf("10,000 objects of 14 MiB: %v seats' worth, want 24", got)
	}
	if got := Work(0, 0); got != 0 {
		t.Errorf("nothing: %v", got)
	}
}

// TestNext: idle windows give the base rate, busy ones the cost per unit
// beside it; a window with a few reads changes nothing, and the estimate
// stays within its bounds.
func TestNext(t *testing.T) {
	const dt = 5 * time.Second
	cores := func(c float64) time.Duration { return time.Duration(c * float64(dt)) }
	start := Estimate{SeatCPU: [kinds]time.Duration{Default, Default}}

	// An idle window (ingest, 0.05 cores): the base, the cost unchanged.
	e := start.Next(cores(0.05), Reads{}, dt)
	if !e.BaseKnown || e.Base != 0.05 || e.SeatCPU[List] != Default {
		t.Fatalf("after an idle window: %+v", e)
	}
	// A flood: 4,000 seats' worth a second on 0.85 cores, 0.80 of them
	// the reads' — 200 µs a seat, half way there in one window.
	flood := func(e Estimate) Estimate { return e.Next(cores(0.85), Reads{List: 4000 * dt.Seconds()}, dt) }
	e = flood(e)
	if !near(e.SeatCPU[List], 150*time.Microsecond) {
		t.Fatalf("after one flooded window: %v, want 150µs", e.SeatCPU[List])
	}
	for range 10 {
		e = flood(e)
	}
	if !near(e.SeatCPU[List], 200*time.Microsecond) || e.SeatCPU[WatchList] != Default {
		t.Fatalf("after eleven flooded windows: %v, want 200µs for LISTs and watch-lists untouched", e.SeatCPU)
	}
	if e.Base != 0.05 {
		t.Fatalf("the base moved under the flood: %v", e.Base)
	}
	learned := e
	// Some reads (200 seats' worth a second, 0.02 cores at Default): too
	// few to learn from, too many to be the base.
	if got := learned.Next(cores(0.1), Reads{List: 200 * dt.Seconds()}, dt); got != learned {
		t.Fatalf("a window of a few reads changed %+v to %+v", learned, got)
	}
	// The next idle window moves the base half way, not the cost.
	if got := learned.Next(cores(0.15), Reads{}, dt); got.Base != 0.1 || got.SeatCPU != learned.SeatCPU {
		t.Fatalf("a busier idle window: %+v", got)
	}
	// Bounds: reads that seem to cost nothing (the base was measured
	// while something else ran) or everything.
	low := learned
	for range 20 {
		low = low.Next(cores(0.05), Reads{List: 4000 * dt.Seconds()}, dt)
	}
	if low.SeatCPU[List] < Min || !near(low.SeatCPU[List], Min) {
		t.Errorf("reads at the base's CPU: %v, want about %v", low.SeatCPU[List], Min)
	}
	high := learned
	for range 20 {
		high = high.Next(cores(2), Reads{List: 600 * dt.Seconds()}, dt)
	}
	if high.SeatCPU[List] > Max || !near(high.SeatCPU[List], Max) {
		t.Errorf("reads on two cores at 600 seats a second: %v, want about %v", high.SeatCPU[List], Max)
	}
	// No base yet (flooded from the start): all the CPU is the reads'.
	if got := start.Next(cores(0.8), Reads{List: 4000 * dt.Seconds()}, dt); !near(got.SeatCPU[List], 150*time.Microsecond) || got.BaseKnown {
		t.Errorf("a first window flooded: %+v", got)
	}
	// Nonsense in, nothing changed.
	for _, bad := range []struct {
		cpu  time.Duration
		work Reads
		dt   time.Duration
	}{{cores(1), Reads{List: 100}, 0}, {-1, Reads{List: 100}, dt}, {cores(1), Reads{List: -1}, dt}, {cores(1), Reads{WatchList: -1}, dt}} {
		if got := learned.Next(bad.cpu, bad.work, bad.dt); got != learned {
			t.Errorf("Next(%v, %v, %v) changed the estimate: %+v", bad.cpu, bad.work, bad.dt, got)
		}
	}
}

// TestNextPerKind: each kind is learned in the windows it dominates, with
// the other kind's reads of the window charged at their current cost.
func TestNextPerKind(t *testing.T) {
	const dt = 5 * time.Second
	cores := func(c float64) time.Duration { return time.Duration(c * float64(dt)) }
	e := Estimate{SeatCPU: [kinds]time.Duration{Default, Default}}.Next(cores(0.05), Reads{}, dt)
	// A LIST flood at 150 µs a seat, then a watch-list flood at 450.
	for range 20 {
		e = e.Next(cores(0.05+4000*150e-6), Reads{List: 4000 * dt.Seconds()}, dt)
	}
	for range 20 {
		e = e.Next(cores(0.05+1500*450e-6), Reads{WatchList: 1500 * dt.Seconds()}, dt)
	}
	if !near(e.SeatCPU[List], 150*time.Microsecond) || !near(e.SeatCPU[WatchList], 450*time.Microsecond) {
		t.Fatalf("after a LIST flood and a watch-list flood: %v, want [150µs 450µs]", e.SeatCPU)
	}
	// The next LIST flood starts at its own cost: one window leaves it
	// there, the watch-lists' cost too.
	if got := e.Next(cores(0.05+4000*150e-6), Reads{List: 4000 * dt.Seconds()}, dt); !near(got.SeatCPU[List], 150*time.Microsecond) || got.SeatCPU[WatchList] != e.SeatCPU[WatchList] {
		t.Errorf("a LIST flood after a watch-list flood: %v", got.SeatCPU)
	}
	// A LIST flood handing over to a watch-list flood: both did many
	// reads, neither nearly all, and the watch-lists' cost is still the
	// default. Both move by one factor (here 1.58: 0.57 cores for a
	// prediction of 0.36), not the LISTs alone by the watch-lists' share
	// (255 µs measured, 203 µs after the window).
	handover := e
	handover.SeatCPU[WatchList] = Default
	got := handover.Next(cores(0.05+2000*150e-6+600*450e-6), Reads{List: 2000 * dt.Seconds(), WatchList: 600 * dt.Seconds()}, dt)
	f := 0.57 / 0.36
	us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	if !near(got.SeatCPU[List], us(150*(1+f)/2)) || !near(got.SeatCPU[WatchList], us(100*(1+f)/2)) {
		t.Errorf("a window shared by a LIST flood and a watch-list flood: %v, want both moved half way to 1.58 times", got.SeatCPU)
	}
	// LISTs and watch-lists flooding together from the start: no kind
	// dominates, both go to the window's cost per seat's worth (the
	// single value learned before kinds were told apart).
	mixedFlood := Estimate{SeatCPU: [kinds]time.Duration{Default, Default}}.Next(cores(0.05), Reads{}, dt)
	for range 20 {
		mixedFlood = mixedFlood.Next(cores(0.05+2000*150e-6+600*450e-6), Reads{List: 2000 * dt.Seconds(), WatchList: 600 * dt.Seconds()}, dt)
	}
	if want := us(0.57 / 2600 * 1e6); !near(mixedFlood.SeatCPU[List], want) || !near(mixedFlood.SeatCPU[WatchList], want) {
		t.Errorf("a mixed flood: %v, want both about %v", mixedFlood.SeatCPU, want)
	}
	// A watch-list flood with some LISTs (100 seats' worth a second, too
	// few to learn from): their CPU at 150 µs is not the watch-lists'.
	mixed := cores(0.05 + 100*150e-6 + 1500*450e-6)
	if got := e.Next(mixed, Reads{List: 100 * dt.Seconds(), WatchList: 1500 * dt.Seconds()}, dt); !near(got.SeatCPU[WatchList], 450*time.Microsecond) || got.SeatCPU[List] != e.SeatCPU[List] {
		t.Errorf("a watch-list flood beside a few LISTs: %v, want [150µs 450µs]", got.SeatCPU)
	}
}

// near: equal but for the floating point's rounding.
func near(a, b time.Duration) bool { return a-b < time.Microsecond && b-a < time.Microsecond }

// TestLearnerRun: the learner reads the process's CPU each window, counts
// Did's work and exports what it learned; a nil learner is Default.
func TestLearnerRun(t *testing.T) {
	var nilLearner *Learner
	nilLearner.Did(List, 5)
	if nilLearner.SeatCPU(WatchList) != Default {
		t.Fatal("a nil learner is not Default")
	}
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "seat_cpu"}, []string{"kind"})
	l := New(gauge, logr.Discard())
	for _, kind := range []string{"list", "watch-list"} {
		if got := testutil.ToFloat64(gauge.WithLabelValues(kind)); got != Default.Seconds() {
			t.Fatalf("%s gauge starts at %v", kind, got)
		}
	}
	// The process's real CPU time is read.
	if c, err := processCPU(); err != nil || c <= 0 {
		t.Fatalf("process CPU time %v, %v", c, err)
	}
	l.window = 100 * time.Millisecond
	// A fake CPU clock: 0.05 cores idle in the first window, then
	// 0.85 cores with 4,000 seats' worth a second.
	var cpu time.Duration
	var windows int
	l.cpu = func() (time.Duration, error) {
		switch windows++; {
		case windows == 1:
		case windows == 2:
			cpu += time.Duration(0.05 * float64(l.window))
		default:
			cpu += time.Duration(0.85 * float64(l.window))
			l.Did(WatchList, 4000*l.window.Seconds())
		}
		return cpu, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for l.SeatCPU(WatchList) == Default && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	// Windows are as long as the ticker's, not exactly Window: about
	// 150 µs after the first flooded window.
	if got := l.SeatCPU(WatchList); got < 120*time.Microsecond || got > 180*time.Microsecond {
		t.Fatalf("after an idle and a flooded window of watch-lists: %v, want about 150µs", got)
	}
	if got := l.SeatCPU(List); got != Default {
		t.Errorf("LISTs learned %v from a watch-list flood, want %v", got, Default)
	}
	if got := testutil.ToFloat64(gauge.WithLabelValues("watch-list")); got != l.SeatCPU(WatchList).Seconds() {
		t.Errorf("gauge %v, estimate %v", got, l.SeatCPU(WatchList))
	}
}

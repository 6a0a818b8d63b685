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
	start := Estimate{SeatCPU: Default}

	// An idle window (ingest, 0.05 cores): the base, the cost unchanged.
	e := start.Next(cores(0.05), 0, dt)
	if !e.BaseKnown || e.Base != 0.05 || e.SeatCPU != Default {
		t.Fatalf("after an idle window: %+v", e)
	}
	// A flood: 4,000 seats' worth a second on 0.85 cores, 0.80 of them
	// the reads' — 200 µs a seat, half way there in one window.
	flood := func(e Estimate) Estimate { return e.Next(cores(0.85), 4000*dt.Seconds(), dt) }
	e = flood(e)
	if !near(e.SeatCPU, 150*time.Microsecond) {
		t.Fatalf("after one flooded window: %v, want 150µs", e.SeatCPU)
	}
	for range 10 {
		e = flood(e)
	}
	if !near(e.SeatCPU, 200*time.Microsecond) {
		t.Fatalf("after eleven flooded windows: %v, want 200µs", e.SeatCPU)
	}
	if e.Base != 0.05 {
		t.Fatalf("the base moved under the flood: %v", e.Base)
	}
	learned := e
	// Some reads (200 seats' worth a second, 0.02 cores at Default): too
	// few to learn from, too many to be the base.
	if got := learned.Next(cores(0.1), 200*dt.Seconds(), dt); got != learned {
		t.Fatalf("a window of a few reads changed %+v to %+v", learned, got)
	}
	// The next idle window moves the base half way, not the cost.
	if got := learned.Next(cores(0.15), 0, dt); got.Base != 0.1 || got.SeatCPU != learned.SeatCPU {
		t.Fatalf("a busier idle window: %+v", got)
	}
	// Bounds: reads that seem to cost nothing (the base was measured
	// while something else ran) or everything.
	low := learned
	for range 20 {
		low = low.Next(cores(0.05), 4000*dt.Seconds(), dt)
	}
	if low.SeatCPU < Min || !near(low.SeatCPU, Min) {
		t.Errorf("reads at the base's CPU: %v, want about %v", low.SeatCPU, Min)
	}
	high := learned
	for range 20 {
		high = high.Next(cores(2), 600*dt.Seconds(), dt)
	}
	if high.SeatCPU > Max || !near(high.SeatCPU, Max) {
		t.Errorf("reads on two cores at 600 seats a second: %v, want about %v", high.SeatCPU, Max)
	}
	// No base yet (flooded from the start): all the CPU is the reads'.
	if got := start.Next(cores(0.8), 4000*dt.Seconds(), dt); !near(got.SeatCPU, 150*time.Microsecond) || got.BaseKnown {
		t.Errorf("a first window flooded: %+v", got)
	}
	// Nonsense in, nothing changed.
	for _, bad := range []struct {
		cpu  time.Duration
		work float64
		dt   time.Duration
	}{{cores(1), 100, 0}, {-1, 100, dt}, {cores(1), -1, dt}} {
		if got := learned.Next(bad.cpu, bad.work, bad.dt); got != learned {
			t.Errorf("Next(%v, %v, %v) changed the estimate: %+v", bad.cpu, bad.work, bad.dt, got)
		}
	}
}

// near: equal but for the floating point's rounding.
func near(a, b time.Duration) bool { return a-b < time.Microsecond && b-a < time.Microsecond }

// TestLearnerRun: the learner reads the process's CPU each window, counts
// Did's work and exports what it learned; a nil learner is Default.
func TestLearnerRun(t *testing.T) {
	var nilLearner *Learner
	nilLearner.Did(5)
	if nilLearner.SeatCPU() != Default {
		t.Fatal("a nil learner is not Default")
	}
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "seat_cpu"})
	l := New(gauge, logr.Discard())
	if got := testutil.ToFloat64(gauge); got != Default.Seconds() {
		t.Fatalf("gauge starts at %v", got)
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
			l.Did(4000 * l.window.Seconds())
		}
		return cpu, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for l.SeatCPU() == Default && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	// Windows are as long as the ticker's, not exactly Window: about
	// 150 µs after the first flooded window.
	if got := l.SeatCPU(); got < 120*time.Microsecond || got > 180*time.Microsecond {
		t.Fatalf("after an idle and a flooded window: %v, want about 150µs", got)
	}
	if got := testutil.ToFloat64(gauge); got != l.SeatCPU().Seconds() {
		t.Errorf("gauge %v, estimate %v", got, l.SeatCPU())
	}
}

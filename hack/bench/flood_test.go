package main

import (
	"math"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestFloodServerList(t *testing.T) {
	keys, err := floodServerList("apiserver, fleet-aggregated")
	if err != nil || len(keys) != 2 || keys[0] != "apiserver" || keys[1] != "fleet-aggregated" {
		t.Fatalf("got %v, %v", keys, err)
	}
	if _, err := floodServerList("apiserver,aggregator"); err == nil {
		t.Fatal("an unknown server was accepted")
	}
}

func TestBucketQuantile(t *testing.T) {
	before := map[float64]float64{0.001: 10, 0.005: 10, 0.05: 10, math.Inf(1): 10}
	after := map[float64]float64{0.001: 60, 0.005: 108, 0.05: 109, math.Inf(1): 110}
	// 100 observations in between: 50 ≤ 1 ms, 48 more ≤ 5 ms, 1 ≤ 50 ms, 1 beyond.
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 0.001}, {0.9, 0.005}, {0.99, 0.05}, {1, math.Inf(1)}} {
		if got := bucketQuantile(before, after, c.q); got != c.want {
			t.Errorf("q=%v: got %v, want %v", c.q, got, c.want)
		}
	}
	if got := bucketQuantile(after, after, 0.99); got != 0 {
		t.Errorf("no observations: got %v, want 0", got)
	}
	if got := bucketQuantile(nil, nil, 0.99); got != 0 {
		t.Errorf("no histogram: got %v, want 0", got)
	}
}

// TestRunQueueMeter: more spinning threads than cores make this process's
// threads wait for a core, and the meter's total grows; threads that end
// (a goroutine exiting locked to its thread) never make it shrink.
func TestRunQueueMeter(t *testing.T) {
	threads := 2 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
	m := newRunQueueMeter([]int{os.Getpid()})
	start := m.sample()
	var wg sync.WaitGroup
	deadline := time.Now().Add(300 * time.Millisecond)
	for range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			for time.Now().Before(deadline) {
			}
		}()
	}
	mid := start
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if now := m.sample(); now < mid {
			t.Fatalf("the total shrank from %v to %v", mid, now)
		} else {
			mid = now
		}
	}
	wg.Wait()
	end := m.sample()
	if end < mid {
		t.Fatalf("the total shrank from %v to %v after threads ended", mid, end)
	}
	if end-start < 10*time.Millisecond {
		t.Fatalf("%d threads spinning on %d cores for 300 ms waited only %v for a core", threads, runtime.NumCPU(), end-start)
	}
}

// Rounds pooled: the p99 is taken over every round's samples (one slow
// LIST among 180 is not the p99, as it is among one round's 60), counts
// add up, the peaks are the highest, CPU is averaged over the time.
func TestPoolFloodPhases(t *testing.T) {
	round := func(slowest time.Duration, cpu uint64, rss uint64) *floodPhase {
		ph := &floodPhase{name: "lists", node: &floodTally{}, workload: &floodTally{}, flooder: &floodTally{},
			elapsed: time.Minute, cpuMilliCores: cpu, apiMilliCores: cpu / 2, peakRSS: rss, serverRunQueue: time.Duration(cpu) * time.Millisecond, watchDrops: 1}
		for i := range 60 {
			ph.node.add(http.StatusOK, false, time.Duration(i+1)*time.Millisecond/10, nil)
			ph.workload.add(http.StatusOK, false, time.Millisecond, nil)
			ph.flooder.add(http.StatusTooManyRequests, i%2 == 0, time.Millisecond, nil)
		}
		ph.node.lat[59] = slowest
		// The flooder's level: 40, 50, 60 seats, a quarter of them
		// lingering.
		ph.levelLimit, ph.levelLingering = float64(cpu)/10-30, 0.25
		return ph
	}
	phs := []*floodPhase{round(30*time.Millisecond, 700, 200<<20), round(8*time.Millisecond, 800, 210<<20), round(5*time.Millisecond, 900, 205<<20)}
	if p99 := phs[0].node.quantile(0.99); p99 != 30*time.Millisecond {
		t.Fatalf("one round's p99 %v, want its slowest, 30ms", p99)
	}
	got := poolFloodPhases(phs)
	if got.nodeP99 != 8*time.Millisecond {
		t.Errorf("pooled p99 %v, want the second slowest of 180, 8ms", got.nodeP99)
	}
	if got.node.OK != 180 || got.flooder.TooMany != 180 || got.flooder.WithRetryAfter != 90 || got.watchDrops != 3 {
		t.Errorf("counts: node %d, flooder 429 %d (%d with Retry-After), drops %d", got.node.OK, got.flooder.TooMany, got.flooder.WithRetryAfter, got.watchDrops)
	}
	if got.cpuMilliCores != 800 || got.apiMilliCores != 400 || got.peakRSS != 210<<20 || got.serverRunQueue != 800*time.Millisecond || got.elapsed != 3*time.Minute {
		t.Errorf("cpu %d, rss %d, run queue %v, elapsed %v", got.cpuMilliCores, got.peakRSS, got.serverRunQueue, got.elapsed)
	}
	if got.levelLimit != 50 || got.levelLingering != 0.25 {
		t.Errorf("the flooder's level: %g seats, %g lingering; want 50, 0.25", got.levelLimit, got.levelLingering)
	}
	if len(phs[0].node.lat) != 60 {
		t.Errorf("pooling changed a round: %d samples", len(phs[0].node.lat))
	}
}

func TestMetricLine(t *testing.T) {
	for _, tc := range []struct {
		line, name, labels string
		value              float64
		ok                 bool
	}{
		{`cachetier_seat_cpu_seconds 0.00063`, "cachetier_seat_cpu_seconds", "", 0.00063, true},
		{`apiserver_flowcontrol_current_limit_seats{priority_level="global-default"} 51`, "apiserver_flowcontrol_current_limit_seats", `priority_level="global-default"`, 51, true},
		{`x{reason="a b"} 2`, "x", `reason="a b"`, 2, true},
		{`# HELP x a b`, "", "", 0, false},
		{`x{a="b"} NaNish`, "", "", 0, false},
		{``, "", "", 0, false},
	} {
		name, labels, value, ok := metricLine(tc.line)
		if ok != tc.ok || (ok && (name != tc.name || labels != tc.labels || value != tc.value)) {
			t.Errorf("%q: %q %q %g %v", tc.line, name, labels, value, ok)
		}
	}
}

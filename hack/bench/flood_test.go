package main

import (
	"math"
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

package main

import (
	"math"
	"testing"
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

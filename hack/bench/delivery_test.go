package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestStampOf(t *testing.T) {
	for _, c := range []struct {
		event string
		want  int64
		ok    bool
	}{
		{`{"type":"MODIFIED","object":{"metadata":{"annotations":{"` + writtenAt + `":"1700000000123456789"}}}}`, 1700000000123456789, true},
		{`{"type":"MODIFIED","object":{"metadata":{"name":"a"}}}`, 0, false},
		{`{"type":"MODIFIED","object":{"metadata":{"annotations":{"` + writtenAt + `":""}}}}`, 0, false},
		{`{"type":"MODIFIED","object":{"metadata":{"annotations":{"` + writtenAt + `":"12x"}}}}`, 0, false},
		{`{"` + writtenAt + `":"5`, 0, false}, // cut off before the closing quote
	} {
		got, ok := stampOf([]byte(c.event))
		if got != c.want || ok != c.ok {
			t.Errorf("stampOf(%s) = %d, %v; want %d, %v", c.event, got, ok, c.want, c.ok)
		}
	}
	// stampPatch writes what stampOf reads.
	before := time.Now().UnixNano()
	ts, ok := stampOf(stampPatch())
	if !ok || ts < before || ts > time.Now().UnixNano() {
		t.Errorf("stampOf(stampPatch()) = %d, %v; want a time after %d", ts, ok, before)
	}
}

func TestLatencies(t *testing.T) {
	var l latencies
	if l.quantile(0.5) != 0 || l.max() != 0 {
		t.Fatal("an empty histogram has no quantiles")
	}
	var h latencyCounts
	recv := time.Unix(100, 0)
	// 99 events 1 ms late, one 1 s late.
	for range 99 {
		h.record(recv, recv.Add(-time.Millisecond).UnixNano())
	}
	h.record(recv, recv.Add(-time.Second).UnixNano())
	l.add(&h)
	within := func(got, want time.Duration) bool {
		return got >= want && float64(got) <= float64(want)*histGrowth*histGrowth
	}
	if p := l.quantile(0.5); !within(p, time.Millisecond) {
		t.Errorf("p50 = %s, want ~1ms (bucket upper edge)", p)
	}
	if p := l.quantile(0.99); !within(p, time.Millisecond) {
		t.Errorf("p99 = %s, want ~1ms: 99 of 100 events", p)
	}
	if p := l.quantile(1); !within(p, time.Second) {
		t.Errorf("p100 = %s, want ~1s", p)
	}
	if m := l.max(); !within(m, time.Second) {
		t.Errorf("max = %s, want ~1s", m)
	}
	// A second watcher's histogram adds to the counts.
	var h2 latencyCounts
	for range 100 {
		h2.record(recv, recv.Add(-time.Second).UnixNano())
	}
	l.add(&h2)
	// 99 of 200 events at 1 ms, 101 at 1 s.
	if p := l.quantile(0.49); !within(p, time.Millisecond) {
		t.Errorf("merged p49 = %s, want ~1ms", p)
	}
	if p := l.quantile(0.5); !within(p, time.Second) {
		t.Errorf("merged p50 = %s, want ~1s", p)
	}
}

func TestEventReader(t *testing.T) {
	long := strings.Repeat("x", 40<<10) // longer than the reader's buffer
	r := newEventReader(strings.NewReader("{\"a\":1}\n{\"b\":\"" + long + "\"}\n{\"c\":3}\n"))
	for i, want := range []string{`{"a":1}`, `{"b":"` + long + `"}`, `{"c":3}`} {
		got, err := r.next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if strings.TrimSuffix(string(got), "\n") != want {
			t.Fatalf("event %d: %d bytes, want %d", i, len(got), len(want)+1)
		}
	}
	if _, err := r.next(); err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("after the last event: %v, want the stream's end", err)
	}
}

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		ratio, bound float64
		want         string
	}{
		{0.4, 0.5, "<= 0.5 met"},
		{0.5, 0.5, "<= 0.5 met"},
		{0.6, 0.5, "<= 0.5 NOT MET"},
		{ratioOf(1, 0), 0.5, "<= 0.5 n/a"},  // the apiserver's side below noise
		{ratioOf(1, -2), 1.5, "<= 1.5 n/a"}, // negative after subtraction
	} {
		if got := verdict(c.ratio, c.bound); got != c.want {
			t.Errorf("verdict(%v, %v) = %q, want %q", c.ratio, c.bound, got, c.want)
		}
	}
}

func TestWatcherCounts(t *testing.T) {
	n := nodesOptions{nodes: 500}
	got, err := n.watcherCounts()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != 1 || got[1] != 500 || got[2] != 2000 {
		t.Errorf("default watcher counts = %v, want [1 500 2000]", got)
	}
	n = nodesOptions{nodes: 2000}
	if got, _ := n.watcherCounts(); len(got) != 2 || got[0] != 1 || got[1] != 2000 {
		t.Errorf("with 2000 nodes = %v, want [1 2000] (duplicates dropped)", got)
	}
	n.watchers = "0,5"
	if _, err := n.watcherCounts(); err == nil {
		t.Error("W=0 accepted; every tier measures it anyway")
	}
}

func TestBaselinesAt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := baselines{{t0, 2}, {t0.Add(10 * time.Second), 4}, {t0.Add(20 * time.Second), 4}}
	for _, c := range []struct {
		at   time.Duration
		want float64
	}{
		{-5 * time.Second, 2}, // before the first run: the first
		{0, 2},
		{5 * time.Second, 3}, // halfway between 2 and 4
		{15 * time.Second, 4},
		{30 * time.Second, 4}, // after the last: the last
	} {
		if got := b.at(t0.Add(c.at)); got != c.want {
			t.Errorf("at(+%s) = %v, want %v", c.at, got, c.want)
		}
	}
	if v := (baselines{}).at(t0); !math.IsNaN(v) {
		t.Errorf("no runs: %v, want NaN", v)
	}
}

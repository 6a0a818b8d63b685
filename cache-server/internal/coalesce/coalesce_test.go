package coalesce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A caller must get the result of a run that started after it arrived:
// joining a run already in flight could return an RV read before the
// caller's request, which would break read-your-writes.
func TestRunsRunStartsAfterCaller(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	started := make(chan int64, 10)
	c := New(func(ctx context.Context) (uint64, error) {
		n := runs.Add(1)
		started <- n
		<-release
		return uint64(n), nil
	})
	ctx := context.Background()

	first := make(chan uint64)
	go func() { rv, _ := c.Do(ctx); first <- rv }()
	if n := <-started; n != 1 {
		t.Fatalf("first run %d", n)
	}
	// These arrive while run 1 is in flight: they must all share run 2.
	var wg sync.WaitGroup
	late := make([]uint64, 5)
	for i := range late {
		wg.Add(1)
		go func() { defer wg.Done(); late[i], _ = c.Do(ctx) }()
	}
	time.Sleep(50 * time.Millisecond) // let them queue behind run 1
	release <- struct{}{}             // finish run 1
	if rv := <-first; rv != 1 {
		t.Fatalf("first caller got run %d, want 1", rv)
	}
	if n := <-started; n != 2 {
		t.Fatalf("second run %d", n)
	}
	release <- struct{}{}
	wg.Wait()
	for i, rv := range late {
		if rv != 2 {
			t.Errorf("late caller %d got run %d, want 2 (a run that started after it arrived)", i, rv)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs for 6 callers, want 2", n)
	}
}

func TestRunsCallerContext(t *testing.T) {
	block := make(chan struct{})
	c := New(func(ctx context.Context) (uint64, error) { <-block; return 7, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Do(ctx); err == nil {
		t.Fatal("want the caller's context error")
	}
	close(block)
	// The shared run was not cancelled by the impatient caller.
	if rv, err := c.Do(context.Background()); err != nil || rv != 7 {
		t.Fatalf("next caller: %d %v", rv, err)
	}
}

// Since: a request received before a run started is served by that run —
// finished or in flight — and waits for no other; one received after it
// gets a new run. A failed run serves nobody after it.
func TestRunsSince(t *testing.T) {
	var runs atomic.Int64
	gate := make(chan error, 1)
	r := New(func(ctx context.Context) (uint64, error) {
		n := runs.Add(1)
		if err := <-gate; err != nil {
			return 0, err
		}
		return uint64(n), nil
	})
	ctx := context.Background()
	received := time.Now()
	gate <- nil
	if rv, err := r.Do(ctx); rv != 1 || err != nil {
		t.Fatalf("first run: %d %v", rv, err)
	}
	// Received before run 1 started: run 1's result, no new run.
	if rv, err := r.Since(ctx, received); rv != 1 || err != nil || runs.Load() != 1 {
		t.Fatalf("received before the finished run: %d %v after %d runs, want 1 from run 1", rv, err, runs.Load())
	}
	// Received after it: a new run.
	gate <- nil
	if rv, err := r.Since(ctx, time.Now()); rv != 2 || err != nil {
		t.Fatalf("received after the finished run: %d %v, want run 2", rv, err)
	}
	// In flight, run 3 started after received2: a caller received then
	// joins it, a caller received after it started waits for run 4.
	received2 := time.Now()
	third := make(chan uint64)
	go func() { rv, _ := r.Do(ctx); third <- rv }()
	for runs.Load() != 3 {
		time.Sleep(time.Millisecond)
	}
	joined := make(chan uint64)
	go func() { rv, _ := r.Since(ctx, received2); joined <- rv }()
	later := make(chan uint64)
	go func() { rv, _ := r.Since(ctx, time.Now()); later <- rv }()
	time.Sleep(20 * time.Millisecond)
	gate <- nil
	if a, b := <-third, <-joined; a != 3 || b != 3 {
		t.Fatalf("run 3's caller got %d, the one received before it started %d; want 3 and 3", a, b)
	}
	gate <- nil
	if rv := <-later; rv != 4 {
		t.Fatalf("received while run 3 was in flight: %d, want run 4", rv)
	}
	// A failed run is not reused: the next caller, whenever received,
	// gets a new run.
	before := time.Now()
	gate <- errors.New("apiserver unreachable")
	if _, err := r.Do(ctx); err == nil {
		t.Fatal("run 5 should fail")
	}
	gate <- nil
	if rv, err := r.Since(ctx, before); rv != 6 || err != nil {
		t.Fatalf("after a failed run: %d %v, want run 6", rv, err)
	}
}

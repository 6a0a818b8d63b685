package upstream

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A caller must get the result of a run that started after it arrived:
// joining a run already in flight could return an RV read before the
// caller's request, which would break read-your-writes.
func TestCoalescerRunStartsAfterCaller(t *testing.T) {
	var runs atomic.Int64
	release := make(chan struct{})
	started := make(chan int64, 10)
	c := &coalescer{fn: func(ctx context.Context) (uint64, error) {
		n := runs.Add(1)
		started <- n
		<-release
		return uint64(n), nil
	}}
	ctx := context.Background()

	first := make(chan uint64)
	go func() { rv, _ := c.do(ctx); first <- rv }()
	if n := <-started; n != 1 {
		t.Fatalf("first run %d", n)
	}
	// These arrive while run 1 is in flight: they must all share run 2.
	var wg sync.WaitGroup
	late := make([]uint64, 5)
	for i := range late {
		wg.Add(1)
		go func() { defer wg.Done(); late[i], _ = c.do(ctx) }()
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

func TestCoalescerCallerContext(t *testing.T) {
	block := make(chan struct{})
	c := &coalescer{fn: func(ctx context.Context) (uint64, error) { <-block; return 7, nil }}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.do(ctx); err == nil {
		t.Fatal("want the caller's context error")
	}
	close(block)
	// The shared run was not cancelled by the impatient caller.
	if rv, err := c.do(context.Background()); err != nil || rv != 7 {
		t.Fatalf("next caller: %d %v", rv, err)
	}
}

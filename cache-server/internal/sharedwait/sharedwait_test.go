package sharedwait

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a fake wait: each call records its target and blocks until
// released (or its context ends).
type gate struct {
	calls   atomic.Int32
	targets chan uint64
	release chan error
}

func newGate() *gate { return &gate{targets: make(chan uint64, 16), release: make(chan error)} }

func (g *gate) fn(ctx context.Context, target uint64) error {
	g.calls.Add(1)
	g.targets <- target
	select {
	case err := <-g.release:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func waitInFlight(t *testing.T, g *Group, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.InFlight() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in flight, want %d", g.InFlight(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Readers waiting for the same or a lower version share the call in
// flight; one waiting for a higher version needs a call of its own.
func TestWaitSharesCallsWithAHighEnoughTarget(t *testing.T) {
	var g Group
	f := newGate()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	start := func(i int, target uint64) {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Wait(ctx, target, f.fn) }()
	}
	start(0, 10)
	if got := <-f.targets; got != 10 {
		t.Fatalf("first call for %d, want 10", got)
	}
	start(1, 10)
	start(2, 7)
	time.Sleep(20 * time.Millisecond)
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("%d calls for targets 10, 10, 7; want 1 shared", n)
	}
	start(3, 11)
	if got := <-f.targets; got != 11 {
		t.Fatalf("second call for %d, want 11", got)
	}
	waitInFlight(t, &g, 2)
	f.release <- nil
	f.release <- nil
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
		}
	}
	if n := f.calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2", n)
	}
	waitInFlight(t, &g, 0)
}

// The call's error reaches every waiter that shared it.
func TestWaitSharesErrors(t *testing.T) {
	var g Group
	f := newGate()
	boom := errors.New("shard unreachable")
	res := make(chan error, 2)
	go func() { res <- g.Wait(context.Background(), 5, f.fn) }()
	<-f.targets
	go func() { res <- g.Wait(context.Background(), 5, f.fn) }()
	time.Sleep(20 * time.Millisecond)
	f.release <- boom
	for range 2 {
		if err := <-res; !errors.Is(err, boom) {
			t.Fatalf("got %v, want the call's error", err)
		}
	}
}

// A caller that gives up does not end the call for the others; when the
// last one gives up, the call is cancelled and a new caller starts afresh.
func TestWaitCancelsOnlyWhenEveryWaiterLeft(t *testing.T) {
	var g Group
	f := newGate()
	first, cancelFirst := context.WithCancel(context.Background())
	second, cancelSecond := context.WithCancel(context.Background())
	res := make(chan error, 2)
	go func() { res <- g.Wait(first, 3, f.fn) }()
	<-f.targets
	go func() { res <- g.Wait(second, 3, f.fn) }()
	time.Sleep(20 * time.Millisecond)

	cancelFirst()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("first waiter: %v, want its context's error", err)
	}
	if g.InFlight() != 1 {
		t.Fatal("the call ended with its first waiter")
	}
	cancelSecond()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("second waiter: %v", err)
	}
	waitInFlight(t, &g, 0)

	// A later caller does not join the abandoned call.
	go func() { res <- g.Wait(context.Background(), 3, f.fn) }()
	<-f.targets
	f.release <- nil
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if n := f.calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2", n)
	}
}

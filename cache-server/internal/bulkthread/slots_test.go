package bulkthread

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// With its one slot taken, bulk work runs at once at the process's
// priority (not queued behind the lowered one) and is counted unlowered;
// once the slot is free again the next is lowered.
func TestSlotsLowerOnlyWhileOneIsFree(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulk_requests_total"}, []string{"outcome"})
	own := niceOf(t, unix.Gettid())
	s := NewSlots(1)
	var first, second, third, plain int
	s.Counted(6, requests, logr.Discard(), func() {
		first = niceOf(t, unix.Gettid())
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Counted(6, requests, logr.Discard(), func() { second = niceOf(t, unix.Gettid()) })
		}()
		<-done
	})
	s.Counted(6, requests, logr.Discard(), func() { third = niceOf(t, unix.Gettid()) })
	s.Counted(0, requests, logr.Discard(), func() { plain = niceOf(t, unix.Gettid()) })
	if first != 6 || third != 6 {
		t.Errorf("work with a free slot at nice %d and %d, want 6", first, third)
	}
	if second != own || plain != own {
		t.Errorf("work without a free slot at nice %d, plain work at %d; want the process's %d", second, plain, own)
	}
	if got := testutil.ToFloat64(requests.WithLabelValues("lowered")); got != 2 {
		t.Errorf("lowered: %g, want 2", got)
	}
	if got := testutil.ToFloat64(requests.WithLabelValues("unlowered")); got != 1 {
		t.Errorf("unlowered: %g, want 1", got)
	}
}

// No slots (one Go P: a lowered thread would hold the only one) lowers
// nothing.
func TestNoSlotsLowerNothing(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulk_requests_total"}, []string{"outcome"})
	own := niceOf(t, unix.Gettid())
	for _, n := range []int{0, -1} {
		got := -100
		NewSlots(n).Counted(6, requests, logr.Discard(), func() { got = niceOf(t, unix.Gettid()) })
		if got != own {
			t.Errorf("%d slots: work at nice %d, want the process's %d", n, got, own)
		}
	}
	if got := testutil.ToFloat64(requests.WithLabelValues("unlowered")); got != 2 {
		t.Errorf("unlowered: %g, want 2", got)
	}
}

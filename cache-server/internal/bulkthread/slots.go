package bulkthread

import (
	"runtime"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Slots bounds how much bulk work a process runs lowered at once.
//
// A lowered thread holds one of Go's Ps while it runs, also while the
// kernel runs other threads instead of it; with every P so held, the
// process's other goroutines — the short requests that lowering was for
// — wait for the kernel to run a nice thread, and so does a garbage
// collection's stop-the-world. A server that admits little bulk work at
// once (priority and fairness on a standalone tier or a front) does not
// get there; a fleet's shard, which serves every front's fan-out with no
// admission of its own, ran two or three lowered at once and its short
// reads got slower than with no lowering at all. So a shard lowers bulk
// work only while a P stays free for the rest, and runs the remainder at
// its own priority at once (not queued: a slow reader must not hold up
// the next).
type Slots struct {
	free chan struct{}
}

// NewSlots returns n slots; n ≤ 0 lowers nothing.
func NewSlots(n int) *Slots {
	return &Slots{free: make(chan struct{}, max(n, 0))}
}

// SlotsBesideOneP is the most lowered work that leaves one of the
// process's Ps (GOMAXPROCS) free: none with a single P.
func SlotsBesideOneP() int { return runtime.GOMAXPROCS(0) - 1 }

// Counted runs f lowered to nice, as Counted does for a bulk request's
// context, when nice is not 0 and a slot is free; with every slot taken,
// at once at the process's priority, counted as outcome "unlowered".
func (s *Slots) Counted(nice int, requests *prometheus.CounterVec, log logr.Logger, f func()) {
	if nice == 0 {
		f()
		return
	}
	select {
	case s.free <- struct{}{}:
		defer func() { <-s.free }()
		runCounted(nice, requests, log, f)
	default:
		requests.WithLabelValues("unlowered").Inc()
		f()
	}
}

// Package memrelease returns the memory a bulk load freed to the operating
// system right after the load, instead of leaving it to the runtime's
// background scavenger.
//
// A tier allocates in bulk once per resource: decoding the initial
// watch-list (or LIST) of everything it caches produces several times the
// cached bytes in short-lived garbage (measured: ~6.7 KB allocated per
// 1.4 KB ConfigMap). After the load the collector frees it, but the
// scavenger hands free pages back to the OS slowly, so for minutes the
// pod's resident memory — what the kubelet and a memory limit see — stays
// well above what the tier holds (hack/bench: ~1.7x the cached JSON two
// seconds after sync, ~1.2x live). One forced collection plus release per
// load costs a few milliseconds per 10k objects and happens once per
// resource, not on the request path.
package memrelease

import (
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Releaser coalesces load completions into one release: the first Loaded
// starts a timer of Delay; loads finishing before it fires join that
// release. Start-up, where every cached resource loads at once, thus costs
// one collection instead of one per resource.
type Releaser struct {
	Delay time.Duration
	Log   logr.Logger
	// Released, when set, counts the bytes each release returned.
	Released prometheus.Counter
	// release is debug.FreeOSMemory; tests replace it.
	release func()

	mu      sync.Mutex
	pending bool
	objects int
}

// New returns a Releaser that releases delay after the first of a burst of
// loads.
func New(delay time.Duration, log logr.Logger, released prometheus.Counter) *Releaser {
	return &Releaser{Delay: delay, Log: log, Released: released, release: debug.FreeOSMemory}
}

// Loaded records a completed bulk load of objects objects.
func (r *Releaser) Loaded(objects int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.objects += objects
	if r.pending {
		return
	}
	r.pending = true
	time.AfterFunc(r.Delay, r.fire)
}

func (r *Releaser) fire() {
	r.mu.Lock()
	objects := r.objects
	r.objects, r.pending = 0, false
	r.mu.Unlock()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	r.release()
	runtime.ReadMemStats(&after)
	released := int64(after.HeapReleased) - int64(before.HeapReleased)
	if r.Released != nil && released > 0 {
		r.Released.Add(float64(released))
	}
	r.Log.Info("returned memory freed by bulk loads to the OS",
		"objectsLoaded", objects, "took", time.Since(start).Round(time.Microsecond),
		"heapLiveBytes", after.HeapAlloc, "releasedBytes", released)
}

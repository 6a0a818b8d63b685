// Package bulkthread runs a request's bulk work — a LIST that walks or
// writes thousands of objects — on an OS thread of its own at a lower
// scheduling priority (a higher nice value), so that under contention
// for the cores the kernel runs a short request's threads first: a
// kubelet's indexed LIST, a controller's GET. Priority and fairness
// bounds how many seats a flow holds and, with lingering seats, how much
// CPU a level takes over seconds; it cannot say which runnable thread
// gets a core in the next millisecond, and there a full LIST's 30 ms
// of walking and gzipping delayed every small request queued behind it.
//
// Go schedules goroutines, not threads: a goroutine's thread is whichever
// runs it next. The work therefore runs in a goroutine locked to its
// thread for its whole life and never unlocked, so the runtime ends the
// thread with it (the process's main thread, which Linux cannot end
// alone, it parks for good) and the lowered priority never reaches other
// work. The runtime starts new threads from a template thread, not from
// a locked one, so they do not inherit it either.
//
// Only a request's own work is lowered, and only while it runs: a
// priority inversion (a lowered thread holding a Go P, or the garbage
// collector waiting for it to stop) lasts until the kernel runs it next,
// which a moderate nice value keeps short (the default 10 weighs a
// thread at a tenth of a normal one, not the 1/70th of nice 19).
package bulkthread

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Run runs f on a new OS thread at nice value nice (1 to 19; the
// thread's own, as setpriority(2) sets it for one thread), and waits for
// it. A panic in f is raised again in the caller's goroutine: as is for
// http.ErrAbortHandler (net/http recovers it there and ends the response
// quietly), as a *ThreadPanic for anything else. If the priority cannot
// be changed f still runs, and the error is returned.
func Run(nice int, f func()) error {
	type result struct {
		panicked any
		err      error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine.
		runtime.LockOSThread()
		var res result
		defer func() {
			res.panicked = recover()
			if res.panicked != nil && res.panicked != http.ErrAbortHandler {
				res.panicked = &ThreadPanic{Value: res.panicked, Stack: debug.Stack()}
			}
			done <- res
		}()
		if nice != 0 {
			tid := unix.Gettid()
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
				res.err = fmt.Errorf("nice %d on thread %d: %w", nice, tid, err)
			}
		}
		f()
	}()
	res := <-done
	if res.panicked != nil {
		panic(res.panicked)
	}
	return res.err
}

// ThreadPanic is what Run raises in its caller when f panicked: the value
// and the stack of the bulk thread where it happened. net/http logs a
// handler's panic with the stack of the goroutine that raised it last,
// which here ends in Run, not where the work failed.
type ThreadPanic struct {
	Value any
	Stack []byte
}

func (p *ThreadPanic) Error() string {
	return fmt.Sprintf("%v\n\non the bulk request's thread:\n%s", p.Value, p.Stack)
}

// Unwrap gives the panic's value when it was an error.
func (p *ThreadPanic) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

type niceKey struct{}

// WithBulk marks ctx as a bulk request's, whose work runs at nice (see
// Nice, Counted).
func WithBulk(ctx context.Context, nice int) context.Context {
	return context.WithValue(ctx, niceKey{}, nice)
}

// Nice is the nice value by which a bulk request's work is lowered; 0
// for any other request.
func Nice(ctx context.Context) int {
	n, _ := ctx.Value(niceKey{}).(int)
	return n
}

// Counted runs f as ctx's request asks: by Run at its nice value when it
// is a bulk request's (counted in requests, by outcome "lowered" or
// "failed" — the priority could not be changed, f ran at the process's
// own — and logged at verbosity 1), else at once.
func Counted(ctx context.Context, requests *prometheus.CounterVec, log logr.Logger, f func()) {
	nice := Nice(ctx)
	if nice == 0 {
		f()
		return
	}
	runCounted(nice, requests, log, f)
}

func runCounted(nice int, requests *prometheus.CounterVec, log logr.Logger, f func()) {
	if err := Run(nice, f); err != nil {
		requests.WithLabelValues("failed").Inc()
		log.V(1).Info("bulk work ran at the process's priority", "err", err.Error())
		return
	}
	requests.WithLabelValues("lowered").Inc()
}

package bulkthread

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// niceOf reads thread tid's nice value (field 19 of its stat).
func niceOf(t *testing.T, tid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (in parentheses, which may hold spaces).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	n, err := strconv.Atoi(f[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRunLowersOnlyItsOwnThread(t *testing.T) {
	before := niceOf(t, unix.Gettid())
	var tid, nice int
	if err := Run(7, func() {
		tid = unix.Gettid()
		nice = niceOf(t, tid)
	}); err != nil {
		t.Fatal(err)
	}
	if nice != 7 {
		t.Errorf("f's thread at nice %d, want 7", nice)
	}
	// f's goroutine may have started on the caller's thread (which then
	// ends with it); the caller goes on at its own priority on another.
	if got := niceOf(t, unix.Gettid()); got != before {
		t.Errorf("the caller's thread is at nice %d, was %d", got, before)
	}
	// The thread ends with f's goroutine: no other goroutine can run at
	// its priority. The process's main thread is never ended (Linux would
	// take the process for exited): the runtime parks it for good.
	if tid == os.Getpid() {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d of the bulk work still exists", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunRaisesPanicInCaller(t *testing.T) {
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Fatalf("recovered %v, want http.ErrAbortHandler", p)
		}
	}()
	_ = Run(1, func() { panic(http.ErrAbortHandler) })
	t.Fatal("Run returned after a panic")
}

// failDeepInBulkWork is a named frame that must appear in the stack the
// caller's recovery sees.
func failDeepInBulkWork() { panic(errors.New("index out of step")) }

func TestRunRaisesOtherPanicsWithTheThreadsStack(t *testing.T) {
	defer func() {
		p := recover()
		tp, ok := p.(*ThreadPanic)
		if !ok {
			t.Fatalf("recovered %T %v, want *ThreadPanic", p, p)
		}
		if err, ok := p.(error); !ok || !strings.Contains(err.Error(), "index out of step") || !strings.Contains(err.Error(), "failDeepInBulkWork") {
			t.Fatalf("panic value prints %v, want the value and the bulk thread's stack", p)
		}
		if inner := errors.Unwrap(tp); inner == nil || inner.Error() != "index out of step" {
			t.Fatalf("Unwrap = %v, want the panic's error", inner)
		}
	}()
	_ = Run(1, failDeepInBulkWork)
	t.Fatal("Run returned after a panic")
}

func TestRunReportsRefusal(t *testing.T) {
	// A negative increment needs CAP_SYS_NICE; as root it is allowed, so
	// only an unprivileged run sees the error. Either way f runs.
	ran := false
	err := Run(-1, func() { ran = true })
	if !ran {
		t.Fatal("f did not run")
	}
	if os.Geteuid() != 0 && err == nil {
		t.Error("raising priority unprivileged: no error")
	}
}

func TestBulkContext(t *testing.T) {
	if n := Nice(context.Background()); n != 0 {
		t.Errorf("a plain context's nice: %d", n)
	}
	if n := Nice(WithBulk(context.Background(), 10)); n != 10 {
		t.Errorf("WithBulk(10)'s nice: %d", n)
	}
}

func TestCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulk_requests_total"}, []string{"outcome"})
	reg.MustRegister(requests)
	own := niceOf(t, unix.Gettid())
	var plain, bulk int
	// A plain request's work runs at once, on the caller's goroutine, and
	// is not counted.
	Counted(context.Background(), requests, logr.Discard(), func() { plain = niceOf(t, unix.Gettid()) })
	Counted(WithBulk(context.Background(), 5), requests, logr.Discard(), func() { bulk = niceOf(t, unix.Gettid()) })
	if plain != own {
		t.Errorf("a plain request's work at nice %d, want the caller's %d", plain, own)
	}
	if bulk != 5 {
		t.Errorf("a bulk request's work at nice %d, want 5", bulk)
	}
	if got := testutil.ToFloat64(requests.WithLabelValues("lowered")); got != 1 {
		t.Errorf("lowered: %g, want 1", got)
	}
	if got := testutil.CollectAndCount(requests); got != 1 {
		t.Errorf("%d series, want only lowered's", got)
	}
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/cache-server/internal/deadline"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

// longWatchFor is how long the long watches stay open and the apiserver's
// objects keep changing: longer than the request deadline (the only
// timeout shorter than a watch's own), so a stream it cut would show.
const longWatchFor = deadline.RequestTimeout + 15*time.Second

// Objects of the long watches: secrets of a type of their own in
// "default", which no other test of the package reads (they compare
// secrets only by type=Opaque and example.com/custom, and never list
// "default"), so the writes can go on while those tests run.
const (
	longWatchNamespace = "default"
	longWatchType      = "cachetier.io/e2e-long-watch"
	longWatchLabel     = "cachetier.io/e2e=long-watch"
)

// TestFleetWatchesOutliveRequestTimeout: a front's change streams from its
// shards, and a client's watch and watch-list through the front, are not
// cut by the request deadline (60 s, package deadline), which bounds every
// request but a watch on standalone servers and fronts. A shard's stream
// (/shard/v1/watch) is no "watch" verb to the request-info parser, so a
// shard serving with the deadline would cut it: the front would reopen it
// (cachetier_fleet_stream_restarts_total, "shard change stream ended"),
// and after an expiry reset every watcher of the hub.
//
// Both watches are opened directly against the front (the aggregator's
// path: e2e/kubectl TestWatchOutlivesRequestTimeout), kept open for
// longWatchFor while a secret is created every 3 s at the apiserver; every
// creation must arrive on both, in order, neither may end, and the front
// must not have reopened any shard's stream (its restart counter; it is
// counted where "shard change stream ended" is logged).
//
// The run starts in TestMain (startLongWatch), right after the fleet, and
// goes on while the package's other tests run: t.Parallel would not
// overlap it with them (a parallel test waits for every sequential test,
// and these share testEnv, so they cannot be parallel). Here the test
// only waits for the run's end and reports it.
//
// The other side, a LIST held past the deadline being cut, is
// deadline.TestSlowReaderIsCut (HTTP/2 and HTTP/1.1).
func TestFleetWatchesOutliveRequestTimeout(t *testing.T) {
	lw := fleetLongWatch
	select {
	case <-lw.done:
	case <-time.After(longWatchFor + 3*time.Minute):
		t.Fatalf("the long watch through the front has not finished %s after it should have", 3*time.Minute)
	}
	for _, n := range lw.notes {
		t.Log(n)
	}
	for _, f := range lw.failures {
		t.Error(f)
	}
}

// longWatch is the background run of TestFleetWatchesOutliveRequestTimeout:
// notes and failures are set once done is closed.
type longWatch struct {
	done            chan struct{}
	notes, failures []string
}

// startLongWatch starts the run against e's fleet and returns at once.
func startLongWatch(e *tiertest.Env) *longWatch {
	lw := &longWatch{done: make(chan struct{})}
	go func() {
		defer close(lw.done)
		if err := lw.run(e); err != nil {
			lw.failures = append(lw.failures, err.Error())
		}
	}()
	return lw
}

func (lw *longWatch) notef(format string, args ...any) {
	lw.notes = append(lw.notes, fmt.Sprintf(format, args...))
}

func (lw *longWatch) failf(format string, args ...any) {
	lw.failures = append(lw.failures, fmt.Sprintf(format, args...))
}

func (lw *longWatch) run(e *tiertest.Env) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	front := e.Fleet()
	before, err := front.Series("cachetier_fleet_stream_restarts_total")
	if err != nil {
		return fmt.Errorf("the front's /metrics: %w", err)
	}
	admin, err := kubernetes.NewForConfig(e.Admin)
	if err != nil {
		return err
	}
	fc, err := kubernetes.NewForConfig(e.FleetAdmin)
	if err != nil {
		return err
	}
	secrets := fc.CoreV1().Secrets(longWatchNamespace)
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: longWatchLabel})
	if err != nil {
		return fmt.Errorf("LIST through the front: %w", err)
	}
	start := time.Now()
	// Without timeoutSeconds, as informers watch: only the server's own
	// watch timeout (30–60 min) may end them.
	watches := []*recordedWatch{
		recordWatch(ctx, "watch", secrets, metav1.ListOptions{LabelSelector: longWatchLabel, ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}, start),
		recordWatch(ctx, "watch-list", secrets, metav1.ListOptions{
			LabelSelector: longWatchLabel, SendInitialEvents: ptr.To(true),
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
		}, start),
	}
	for _, w := range watches {
		if w.err != nil {
			return fmt.Errorf("%s through the front: %w", w.name, w.err)
		}
	}
	if !watches[1].waitFor(func() bool { return watches[1].initialEnd }, 30*time.Second) {
		return fmt.Errorf("watch-list through the front: no initial-events-end bookmark in 30s (ended after %s)", watches[1].endedAfter())
	}

	var written []string
	for i := 0; time.Since(start) < longWatchFor; i++ {
		s, err := admin.CoreV1().Secrets(longWatchNamespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("long-watch-%03d", i), Labels: map[string]string{"cachetier.io/e2e": "long-watch"}},
			Type:       longWatchType,
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create at the apiserver after %s: %w", time.Since(start).Round(time.Second), err)
		}
		written = append(written, eventKey(watch.Added, s))
		time.Sleep(3 * time.Second)
	}
	last := written[len(written)-1]
	for _, w := range watches {
		w.waitFor(func() bool { return slices.Contains(w.events, last) }, 30*time.Second)
	}
	after, err := front.Series("cachetier_fleet_stream_restarts_total")
	if err != nil {
		return fmt.Errorf("the front's /metrics: %w", err)
	}

	for _, w := range watches {
		w.mu.Lock()
		events, ended, errs := slices.Clone(w.events), w.ended, slices.Clone(w.errs)
		w.mu.Unlock()
		if ended != 0 {
			lw.failf("%s through the front ended after %s (a deadline cut it, or the front closed its watchers): %d of %d creations delivered",
				w.name, ended.Round(100*time.Millisecond), countIn(events, written), len(written))
		}
		if len(errs) > 0 {
			lw.failf("%s through the front: error events %v", w.name, errs)
		}
		if !slices.Equal(events, written) {
			lw.failf("%s through the front delivered\n  %s\nwant every creation, in order:\n  %s", w.name, strings.Join(events, "\n  "), strings.Join(written, "\n  "))
		}
		lw.notef("%s through the front: open for %s, %d events", w.name, time.Since(start).Round(time.Second), len(events))
	}
	var reopened []string
	for series, v := range after {
		if v > before[series] {
			reopened = append(reopened, fmt.Sprintf("%s %v -> %v", series, before[series], v))
		}
	}
	slices.Sort(reopened)
	if len(reopened) > 0 {
		lw.failf("the front reopened shards' change streams within %s (does a shard serve them with a request deadline?):\n  %s",
			time.Since(start).Round(time.Second), strings.Join(reopened, "\n  "))
	}
	lw.notef("%d secrets created over %s; the front's stream restarts (cachetier_fleet_stream_restarts_total): %d series before, %d after, %d increased", len(written), longWatchFor, len(before), len(after), len(reopened))
	return nil
}

// recordedWatch is one client-go watch and what it delivered.
type recordedWatch struct {
	name string
	err  error // opening it
	mu   sync.Mutex
	// events are "TYPE name@rv" of every object event, in order.
	events []string
	errs   []string
	// initialEnd: the watch-list's initial-events-end bookmark arrived.
	initialEnd bool
	// ended is how long after start the result channel closed (0: open).
	ended time.Duration
}

type secretWatcher interface {
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

func recordWatch(ctx context.Context, name string, c secretWatcher, opts metav1.ListOptions, start time.Time) *recordedWatch {
	w := &recordedWatch{name: name}
	wi, err := c.Watch(ctx, opts)
	if err != nil {
		w.err = err
		return w
	}
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			w.mu.Lock()
			switch s, ok := ev.Object.(*corev1.Secret); {
			case ev.Type == watch.Error || !ok:
				w.errs = append(w.errs, fmt.Sprintf("%s %v", ev.Type, ev.Object))
			case ev.Type == watch.Bookmark:
				w.initialEnd = w.initialEnd || s.Annotations[metav1.InitialEventsAnnotationKey] == "true"
			default:
				w.events = append(w.events, eventKey(ev.Type, s))
			}
			w.mu.Unlock()
		}
		w.mu.Lock()
		if ctx.Err() == nil {
			w.ended = time.Since(start)
		}
		w.mu.Unlock()
	}()
	return w
}

func eventKey(typ watch.EventType, s *corev1.Secret) string {
	return fmt.Sprintf("%s %s@%s", typ, s.Name, s.ResourceVersion)
}

// waitFor polls cond (under w's lock) until it holds, the watch ended or
// timeout passed.
func (w *recordedWatch) waitFor(cond func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		ok, ended := cond(), w.ended != 0
		w.mu.Unlock()
		if ok || ended || time.Now().After(deadline) {
			return ok
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *recordedWatch) endedAfter() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended
}

func countIn(got, want []string) int {
	n := 0
	for _, k := range want {
		if slices.Contains(got, k) {
			n++
		}
	}
	return n
}

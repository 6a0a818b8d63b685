package kubectl

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// requestTimeout is this suite's kube-apiserver --request-timeout
// (main_test.go; the default is 60 s).
const requestTimeout = 20 * time.Second

// TestWatchOutlivesRequestTimeout: watches through the aggregator last as
// long as against kube-apiserver. Below status.serverURL's prefix
// (…/v1alpha1/watch) the apiserver sees verb watch, a long-running request,
// so neither its --request-timeout nor a deadline ends the proxied stream:
// a client-go watch, a client-go watch-list and `kubectl get -w`, through
// the standalone tier and the fleet's front, stay open for more than three
// times the request timeout and deliver an object created at the end.
// Below the group-version's own path (the server URL of the first
// releases) the same requests are "get" to the apiserver and are cut at the
// request timeout: that is what the prefix changes.
func TestWatchOutlivesRequestTimeout(t *testing.T) {
	const ns = "long-watch"
	watchFor := 3*requestTimeout + 5*time.Second
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	create := func(name string) {
		t.Helper()
		if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	create("seed")
	root := filepath.Join(env.CP.Dir, "kubeconfig-admin-aggregated-root-watch")
	noErr(t, agg.RootKubeconfig(env.CP.AdminKubeconfig, root))

	start := time.Now()
	paths := []struct {
		name, kubeconfig string
		cut, kubectl     bool
	}{
		{"serverURL", aggKubeconfig, false, true},
		{"fleet serverURL", fleetKubeconfig, false, false},
		{"root", root, true, true},
	}
	var watchers []*configMapWatcher
	kubectls := map[string]*watchRun{}
	for _, p := range paths {
		cfg, err := clientcmd.BuildConfigFromFlags("", p.kubeconfig)
		noErr(t, err)
		for _, watchList := range []bool{false, true} {
			watchers = append(watchers, watchConfigMaps(t, p.name, kubernetes.NewForConfigOrDie(cfg), ns, watchList, p.cut, start))
		}
		if p.kubectl {
			kubectls[p.name] = startWatch(t, p.kubeconfig, "get", "configmaps", "-n", ns, "-w")
		}
	}
	for _, w := range watchers {
		w.waitSeen(t, "seed", 30*time.Second)
	}
	// Changes all along, then one at the end that every open watch must
	// deliver.
	for i := 0; time.Since(start) < watchFor; i++ {
		create(fmt.Sprintf("tick-%03d", i))
		time.Sleep(3 * time.Second)
	}
	create("final")
	for _, w := range watchers {
		if w.cut {
			w.waitEnded(t, 10*time.Second)
			continue
		}
		w.waitSeen(t, "final", 30*time.Second)
		if ended, errs := w.result(); ended != 0 || len(errs) > 0 {
			t.Errorf("%s: ended after %s, errors %v", w.name, ended, errs)
		}
		t.Logf("%s: open for %s, %d objects seen", w.name, time.Since(start).Round(time.Second), w.count())
	}
	for _, w := range watchers {
		if !w.cut {
			continue
		}
		// The apiserver ends the proxied request at its request timeout
		// (the watch starts a moment after start).
		if ended, _ := w.result(); ended < requestTimeout || ended > 2*requestTimeout {
			t.Errorf("%s: ended after %s, want the request timeout (%s)", w.name, ended, requestTimeout)
		} else {
			t.Logf("%s: cut by the apiserver after %s", w.name, ended.Round(100*time.Millisecond))
		}
	}

	live := kubectls["serverURL"]
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(live.String(), "final") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !live.Running() {
		t.Errorf("kubectl get -w through status.serverURL ended: %v\nstdout:\n%s\nstderr:\n%s", live.Err(), clip(live.String()), live.Stderr.String())
	}
	if out := live.String(); !strings.Contains(out, "final") || !strings.Contains(out, "tick-000") || live.Stderr.String() != "" {
		t.Errorf("kubectl get -w through status.serverURL after %s:\nstdout:\n%s\nstderr:\n%s", time.Since(start).Round(time.Second), clip(out), live.Stderr.String())
	}
	t.Logf("kubectl get -w through status.serverURL: running after %s, %d lines", time.Since(start).Round(time.Second), strings.Count(live.String(), "\n"))
	cut := kubectls["root"]
	if !cut.Running() {
		t.Logf("kubectl get -w below the group-version's path: ended (%v) before %s; stderr %q; last line %q",
			cut.Err(), time.Since(start).Round(time.Second), cut.Stderr.String(), lastLine(cut.String()))
		if strings.Contains(cut.String(), "final") {
			t.Errorf("kubectl get -w below the group-version's path printed an object created after it ended")
		}
	} else {
		t.Errorf("kubectl get -w below the group-version's path still runs after %s: the apiserver's request timeout (%s) did not cut it", time.Since(start).Round(time.Second), requestTimeout)
	}
}

// configMapWatcher is one client-go watch of a namespace's ConfigMaps:
// what it delivered and when it ended.
type configMapWatcher struct {
	name string
	cut  bool // expected to be ended by the apiserver
	mu   sync.Mutex
	seen map[string]bool
	errs []string
	// ended is how long after the test's start the result channel closed
	// (0: still open).
	ended time.Duration
	done  chan struct{}
}

// watchConfigMaps starts a watch (resourceVersion unset: the existing
// objects first, as ADDED events) or a watch-list (sendInitialEvents, as
// client-go's reflector sends it), without timeoutSeconds, as informers do.
func watchConfigMaps(t *testing.T, path string, kc kubernetes.Interface, ns string, watchList, cut bool, start time.Time) *configMapWatcher {
	t.Helper()
	opts := metav1.ListOptions{}
	kind := "watch"
	if watchList {
		kind = "watch-list"
		opts = metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}
	}
	w := &configMapWatcher{name: path + " " + kind, cut: cut, seen: map[string]bool{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	wi, err := kc.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
	if err != nil {
		t.Fatalf("%s: %v", w.name, err)
	}
	go func() {
		defer close(w.done)
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			w.mu.Lock()
			switch ev.Type {
			case watch.Added, watch.Modified:
				if cm, ok := ev.Object.(*corev1.ConfigMap); ok {
					w.seen[cm.Name] = true
				}
			case watch.Error:
				w.errs = append(w.errs, fmt.Sprint(ev.Object))
			}
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.ended = time.Since(start)
		w.mu.Unlock()
	}()
	return w
}

func (w *configMapWatcher) result() (time.Duration, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ended, append([]string(nil), w.errs...)
}

func (w *configMapWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

func (w *configMapWatcher) waitSeen(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		seen, ended := w.seen[name], w.ended
		w.mu.Unlock()
		switch {
		case seen:
			return
		case ended != 0:
			t.Fatalf("%s: ended after %s before delivering %s", w.name, ended.Round(100*time.Millisecond), name)
		case time.Now().After(deadline):
			t.Fatalf("%s: %s not delivered in %s", w.name, name, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (w *configMapWatcher) waitEnded(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		t.Errorf("%s: still open %s after the last change", w.name, timeout)
	}
}

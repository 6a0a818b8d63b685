package install

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/hack/bgcmd"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// liveWatchFor is how long `kubectl get -w` through status.serverURL must
// stay a live watch: five times kube-apiserver's default --request-timeout
// (60 s), which cut it after 61 s while the server URL had no /watch.
const liveWatchFor = 5 * time.Minute

// liveWatch is a `kubectl get configmaps -w` through status.serverURL,
// running while the story goes on.
type liveWatch struct {
	*bgcmd.Cmd
	ns      string
	started time.Time
}

// startLiveWatch starts the watch and waits for its first rows (the
// namespace's configmaps, listed through the tier). It runs past the step
// that starts it: checkLiveWatch stops it, or the story's cleanup if a step
// fails first.
func (e *env) startLiveWatch(t *testing.T, tier string) *liveWatch {
	w := &liveWatch{ns: cachedNamespaces[0], started: time.Now()}
	c, err := bgcmd.Start(e.c.Kubectl(), "--kubeconfig="+tier, "get", "configmaps", "-n", w.ns, "-w")
	if err != nil {
		t.Fatal(err)
	}
	w.Cmd = c
	e.waitWatchPrints(t, w, "cm-000", time.Minute)
	return w
}

// checkLiveWatch: after at least d (waiting for what the steps before took
// less), kubectl still runs, has printed nothing on stderr, and prints a
// configmap created now. Then it is stopped.
func (e *env) checkLiveWatch(t *testing.T, w *liveWatch, d time.Duration) {
	if left := d - time.Since(w.started); left > 0 {
		t.Logf("the story took %s since kubectl get -w started; waiting %s more", time.Since(w.started).Round(time.Second), left.Round(time.Second))
		select {
		case <-w.Exited():
		case <-time.After(left):
		}
	}
	name := fmt.Sprintf("live-watch-%d", time.Now().Unix())
	ctx := context.Background()
	if _, err := e.kc.CoreV1().ConfigMaps(w.ns).Create(ctx, nodeinstall.SampleConfigMap(name, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.kc.CoreV1().ConfigMaps(w.ns).Delete(ctx, name, metav1.DeleteOptions{}) }()
	e.waitWatchPrints(t, w, name, time.Minute)
	if s := w.Stderr.String(); s != "" {
		t.Errorf("kubectl get -w wrote to stderr: %s", s)
	}
	t.Logf("kubectl get -w through status.serverURL: live after %s (%d lines)", time.Since(w.started).Round(time.Second), strings.Count(w.Stdout.String(), "\n"))
	w.Stop()
}

// waitWatchPrints waits until kubectl printed a row of the configmap
// name, failing if it ends first.
func (e *env) waitWatchPrints(t *testing.T, w *liveWatch, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(w.Stdout.String(), name+" ") {
		if !w.Running() {
			t.Fatalf("kubectl get -w through status.serverURL ended after %s (%v) before printing %s\nstdout:\n%s\nstderr:\n%s",
				time.Since(w.started).Round(time.Second), w.Err(), name, clip(w.Stdout.String()), w.Stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl get -w through status.serverURL did not print %s in %s\nstdout:\n%s\nstderr:\n%s", name, timeout, clip(w.Stdout.String()), w.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

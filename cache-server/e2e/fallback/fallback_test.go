// Package fallback runs the tier against a kube-apiserver with the WatchList
// feature off: ingestion must fall back to LIST+WATCH, and consistent reads
// must still find the apiserver's current resourceVersion (a LIST of one
// item instead of the watch-list RV fetch).
package fallback

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

const ns = "fallback"

var env *tiertest.Env

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		ServiceClusterIPRange: "127.83.0.0/24",
		ExtraAPIServerFlags:   []string{"--feature-gates=WatchList=false"},
		Spec: v1alpha1.CacheProfileSpec{HashShards: 2, Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
		}},
		Seed: func(ctx context.Context, admin *rest.Config) error {
			kc := kubernetes.NewForConfigOrDie(admin)
			if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			// More than one 500-item page, so the fallback LIST paginates.
			for i := 0; i < 520; i++ {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", i), Namespace: ns}}
				if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		},
	}, func(e *tiertest.Env) { env = e }))
}

func TestListWatchFallback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	api := kubernetes.NewForConfigOrDie(env.Admin)
	tier := kubernetes.NewForConfigOrDie(env.TierAdmin)

	// The apiserver really has watch-list off.
	_, err := api.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{SendInitialEvents: ptrTrue(), AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err == nil {
		t.Fatal("the apiserver accepted a watch-list; the test's premise is wrong")
	}
	// The tier serves watch-list from its own cache regardless of the
	// upstream gate (docs/differences.md): initial events, then the
	// initial-events-end bookmark.
	wl, err := tier.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{SendInitialEvents: ptrTrue(), AllowWatchBookmarks: true, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatalf("watch-list through the tier: %v", err)
	}
	added := 0
	for ev := range wl.ResultChan() {
		if ev.Type == watch.Added {
			added++
			continue
		}
		if cm, ok := ev.Object.(*corev1.ConfigMap); ev.Type == watch.Bookmark && ok && cm.Annotations["k8s.io/initial-events-end"] == "true" {
			break
		}
		t.Fatalf("unexpected %s event during the watch-list", ev.Type)
	}
	wl.Stop()
	if added != 520 {
		t.Fatalf("watch-list through the tier: %d initial events, want 520", added)
	}
	if v := metric(t, `cachetier_upstream_watchlist_fallbacks_total{resource="configmaps"}`); v == "" || v == "0" {
		t.Fatalf("no LIST+WATCH fallback counted (%q)", v)
	}

	// Read-your-writes through a consistent LIST: the RV fetch falls back
	// to a LIST of one key (upstream.rvFetchListQuery).
	created, err := api.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := tier.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := keys(want), keys(got); a != b {
		t.Fatalf("tier LIST differs from the apiserver's:\n tier %d items, apiserver %d items", len(got.Items), len(want.Items))
	}
	if !strings.Contains(keys(got), "late@"+created.ResourceVersion) {
		t.Fatal("the consistent LIST through the tier misses the write")
	}

	// Live events keep flowing on the fallback WATCH.
	w, err := tier.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: got.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := api.CoreV1().ConfigMaps(ns).Delete(ctx, "late", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if cm, ok := ev.Object.(*corev1.ConfigMap); ev.Type != watch.Deleted || !ok || cm.Name != "late" {
			t.Fatalf("got %s %v, want DELETED late", ev.Type, ev.Object)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no DELETED event through the tier within 20s")
	}
}

func ptrTrue() *bool { b := true; return &b }

func keys(l *corev1.ConfigMapList) string {
	var k []string
	for _, cm := range l.Items {
		k = append(k, cm.Name+"@"+cm.ResourceVersion)
	}
	sort.Strings(k)
	return strings.Join(k, "\n")
}

// metric reads one series from the tier's /metrics.
func metric(t *testing.T, series string) string {
	t.Helper()
	v, err := env.Metric(series)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

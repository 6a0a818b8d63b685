// Package relist proves what happens when the tier's upstream watch cannot
// resume: storage changes that no watcher saw, then a kube-apiserver whose
// watch cache no longer reaches back to the tier's resourceVersion (410
// Gone). The tier must relist and hand its own watchers the difference as
// events, without disconnecting them — standalone, and a fleet whose two
// shards relist on their own behind a front.
package relist

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

const ns = "relist"

var env *tiertest.Env

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		ServiceClusterIPRange: "127.82.0.0/24",
		Spec: v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
		}},
		Seed: func(ctx context.Context, admin *rest.Config) error {
			kc := kubernetes.NewForConfigOrDie(admin)
			if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			for _, n := range []string{"cm-a", "cm-b", "cm-c"} {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns}, Data: map[string]string{"v": "1"}}
				if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		},
		FleetShards: 2,
	}, func(e *tiertest.Env) { env = e }))
}

func TestUpstreamRelistReachesWatchersAsEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	api := kubernetes.NewForConfigOrDie(env.Admin)
	// The standalone tier and a fleet (two shards, each relisting on its
	// own, behind a front) watch through the same upstream relist.
	tiers := map[string]kubernetes.Interface{
		"standalone": kubernetes.NewForConfigOrDie(env.TierAdmin),
		"fleet":      kubernetes.NewForConfigOrDie(env.FleetAdmin),
	}
	watches := map[string]watch.Interface{}
	for name, tier := range tiers {
		list, err := tier.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := tier.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		watches[name] = w
	}

	// The new state of cm-b and cm-d as JSON the apiserver can read back
	// from etcd (its storage decoder recognizes JSON as well as protobuf).
	cmB, err := api.CoreV1().ConfigMaps(ns).Get(ctx, "cm-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmB.TypeMeta = metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"}
	cmB.ResourceVersion = ""
	cmB.ManagedFields = nil
	cmB.Data = map[string]string{"v": "changed behind the tier's back"}
	cmD := cmB.DeepCopy()
	cmD.Name, cmD.UID, cmD.Data = "cm-d", "5b0f4a2e-0d7e-4d3c-9f1e-6a1c2b3d4e5f", map[string]string{"v": "new"}

	err = env.CP.RestartAPIServer(ctx, func(ctx context.Context) error {
		etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{env.CP.EtcdURL}, DialTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer etcd.Close()
		if _, err := etcd.Delete(ctx, "/registry/configmaps/"+ns+"/cm-a"); err != nil {
			return err
		}
		for _, cm := range []*corev1.ConfigMap{cmB, cmD} {
			data, err := json.Marshal(cm)
			if err != nil {
				return err
			}
			if _, err := etcd.Put(ctx, "/registry/configmaps/"+ns+"/"+cm.Name, string(data)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("restart apiserver: %v", err)
	}

	// The tier's upstream watch resumes from an RV the new watch cache does
	// not have: 410, relist, and the difference reaches our watcher on the
	// same, still open stream.
	want := map[string]watch.EventType{"cm-a": watch.Deleted, "cm-b": watch.Modified, "cm-d": watch.Added}
	apiList, err := api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tier := range tiers {
		t.Run(name, func(t *testing.T) {
			got := map[string]watch.EventType{}
			deadline := time.After(90 * time.Second)
			for len(got) < len(want) {
				select {
				case ev, ok := <-watches[name].ResultChan():
					if !ok {
						t.Fatalf("the tier closed the watch during the upstream relist (got %v so far)", got)
					}
					if ev.Type == watch.Bookmark || ev.Type == watch.Error {
						if ev.Type == watch.Error {
							t.Fatalf("ERROR event: %v", ev.Object)
						}
						continue
					}
					cm := ev.Object.(*corev1.ConfigMap)
					if _, dup := got[cm.Name]; dup {
						t.Fatalf("second event for %s: %s", cm.Name, ev.Type)
					}
					got[cm.Name] = ev.Type
					if cm.Name == "cm-b" && cm.Data["v"] != "changed behind the tier's back" {
						t.Fatalf("MODIFIED cm-b carries %v", cm.Data)
					}
				case <-deadline:
					t.Fatalf("after 90s got %v, want %v", got, want)
				}
			}
			for name, typ := range want {
				if got[name] != typ {
					t.Errorf("%s: %s, want %s", name, got[name], typ)
				}
			}
			// The tier now serves exactly the apiserver's state.
			tierList, err := tier.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := keysAndRVs(apiList), keysAndRVs(tierList); a != b {
				t.Fatalf("after the relist the tier serves\n%s\nthe apiserver\n%s", b, a)
			}
		})
	}
	// And the standalone tier says it relisted.
	if m := metric(t, `cachetier_upstream_relists_total{reason="expired",resource="configmaps"}`); m == "" || m == "0" {
		t.Fatalf("relist not counted: %q", m)
	}
	// The restart resets the tier's connection; that alone must not make
	// it re-read the resource (it resumes from its RV and relists on the
	// 410). It did when the reset hit the first stream: a second
	// "startup" relist.
	if m := metric(t, `cachetier_upstream_relists_total{reason="startup",resource="configmaps"}`); m != "1" {
		t.Fatalf("start-up relists: %q, want 1", m)
	}
}

func keysAndRVs(l *corev1.ConfigMapList) string {
	var b strings.Builder
	for _, cm := range l.Items {
		fmt.Fprintf(&b, "%s@%s\n", cm.Name, cm.ResourceVersion)
	}
	return b.String()
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

package watch

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// protobufClient is a typed clientset that speaks protobuf only, as
// kube-controller-manager and the kubelet configure theirs.
func protobufClient(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestProtobufWatchMatchesAPIServer runs the same protobuf watches (from an
// RV with a selector, and a watch-list) against the apiserver and the tier
// through a scripted change sequence and compares what client-go decoded.
func TestProtobufWatchMatchesAPIServer(t *testing.T) {
	forEachTier(t, testProtobufWatchMatchesAPIServer)
}

func testProtobufWatchMatchesAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ns := nsName(1)
	api, tier := protobufClient(t, env.Admin), protobufClient(t, env.TierAdmin)
	list, err := api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]metav1.ListOptions{
		"from-rv-selector": {ResourceVersion: list.ResourceVersion, LabelSelector: "app=a"},
		"watch-list": {SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true,
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, LabelSelector: "app=a"},
	}
	type pair struct{ api, tier watch.Interface }
	streams := map[string]pair{}
	for name, opts := range cases {
		a, err := api.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
		if err != nil {
			t.Fatalf("%s on the apiserver: %v", name, err)
		}
		b, err := tier.CoreV1().ConfigMaps(ns).Watch(ctx, opts)
		if err != nil {
			t.Fatalf("%s on the tier: %v", name, err)
		}
		defer a.Stop()
		defer b.Stop()
		streams[name] = pair{a, b}
	}
	time.Sleep(500 * time.Millisecond)

	cms := kubernetes.NewForConfigOrDie(env.Admin).CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pb", Labels: map[string]string{"app": "a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"v": "2"}
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm.Labels["app"] = "b" // out of the selector: DELETED
	if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "pb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	end, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pb-end", Labels: map[string]string{"app": "a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cms.Delete(context.Background(), "pb-end", metav1.DeleteOptions{})

	for name, p := range streams {
		a := drain(t, p.api, end.ResourceVersion)
		b := drain(t, p.tier, end.ResourceVersion)
		if name == "watch-list" {
			sort.Strings(a) // initial events: same set, order may differ
			sort.Strings(b)
		}
		if strings.Join(a, "\n") != strings.Join(b, "\n") {
			t.Errorf("%s: protobuf watch events differ\napiserver:\n  %s\ntier:\n  %s", name, strings.Join(a, "\n  "), strings.Join(b, "\n  "))
		}
	}
}

// drain reads decoded events until the one at endRV, describing each as
// type/name@rv; of the bookmarks only the initial-events-end one, by its
// annotation (RVs and timing of bookmarks differ between servers).
func drain(t *testing.T, w watch.Interface, endRV string) []string {
	t.Helper()
	var out []string
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("stream closed early after %v", out)
			}
			if ev.Type == watch.Error {
				t.Fatalf("ERROR event: %v", ev.Object)
			}
			m, err := metaOf(ev.Object)
			if err != nil {
				t.Fatalf("%s event with %T: %v", ev.Type, ev.Object, err)
			}
			if ev.Type == watch.Bookmark {
				// Only the initial-events-end bookmark belongs to the
				// scripted sequence; periodic bookmarks come when each
				// server's timer fires (the apiserver sent one within a
				// second of a watch-list in one CI run, the tier did not).
				if end := m.GetAnnotations()["k8s.io/initial-events-end"]; end != "" {
					out = append(out, "BOOKMARK initial-events-end="+end)
				}
				continue
			}
			out = append(out, fmt.Sprintf("%s %s@%s", ev.Type, m.GetName(), m.GetResourceVersion()))
			if m.GetResourceVersion() == endRV {
				return out
			}
		case <-timeout:
			t.Fatalf("no event at RV %s after 15s; got %v", endRV, out)
		}
	}
}

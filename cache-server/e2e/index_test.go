package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Field indexes: a LIST that pins an indexed field reads only the objects
// with the value, and its pages must be kube-apiserver's exactly — which
// differ by read: the apiserver answers a first page of a consistent,
// resourceVersion=0 or NotOlderThan LIST of pods by node from its index
// (a page continues only if more pods of that node follow), every other
// read from a snapshot (a page continues if any pod follows). The data
// puts a node's last pod at the end of a full page with other pods after
// it, in every scope, which is where the two rules part.

// indexNamespaces hold the pods of seedIndexData.
var indexNamespaces = []string{"idx-0", "idx-1", "idx-2"}

// seedIndexData creates, in each of indexNamespaces, pods p-00..p-11:
// p-00..p-03 on idx-n1, p-04 and p-05 unscheduled, p-06..p-08 on idx-n2
// (idx-n1 in idx-2), p-09..p-11 on idx-n1 again in idx-1 only (idx-n3
// elsewhere); labels app=a/b alternating; p-00, p-01 and p-06 Running, the
// rest Pending. The tests derive their page sizes from the apiserver's
// answers, not from this layout.
func seedIndexData(ctx context.Context, admin *rest.Config) error {
	kc, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	for _, ns := range indexNamespaces {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for n, ns := range indexNamespaces {
		for i := range 12 {
			g.Go(func() error {
				node := ""
				switch {
				case i < 4:
					node = "idx-n1"
				case i < 6:
				case i < 9 && n == 2:
					node = "idx-n1"
				case i < 9:
					node = "idx-n2"
				case n == 1:
					node = "idx-n1"
				default:
					node = "idx-n3"
				}
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%02d", i), Namespace: ns, Labels: map[string]string{"app": []string{"a", "b"}[i%2]}},
					Spec: corev1.PodSpec{
						NodeName:   node,
						Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
					},
				}
				created, err := kc.CoreV1().Pods(ns).Create(gctx, p, metav1.CreateOptions{})
				if err != nil {
					return err
				}
				if i == 0 || i == 1 || i == 6 {
					created.Status.Phase = corev1.PodRunning
					_, err = kc.CoreV1().Pods(ns).UpdateStatus(gctx, created, metav1.UpdateOptions{})
				}
				return err
			})
		}
	}
	return g.Wait()
}

// matches is the number of items of the apiserver's unpaginated answer.
func matches(t *testing.T, path string, q url.Values) int {
	t.Helper()
	all := cloneValues(q)
	all.Del("limit")
	r := get(t, testEnv.admin, path, all, "")
	if r.code != http.StatusOK {
		t.Fatalf("%s?%s: apiserver %d %s", path, all.Encode(), r.code, r.body)
	}
	var l listView
	if err := json.Unmarshal(r.body, &l); err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

// TestIndexedListMatchesAPIServer compares LISTs by node (and by fields
// only the profile indexes) for every resourceVersion mode × page size ×
// continue page, cluster-wide and namespaced, with "=", "==", "!=", the
// empty value and label selectors. Page sizes include exactly the number
// of matches, and one less and one more.
func TestIndexedListMatchesAPIServer(t *testing.T) { forEachTier(t, testIndexedListMatchesAPIServer) }

func testIndexedListMatchesAPIServer(t *testing.T) {
	rv := currentRV(t)
	pods := [][2]string{
		{"", "spec.nodeName=idx-n1"},
		{"", "spec.nodeName==idx-n2"},
		{"", "spec.nodeName="}, // unscheduled
		{"", "spec.nodeName=node-1"},
		{"", "spec.nodeName=no-such-node"},
		{"", "spec.nodeName!=idx-n1"},
		{"app=a", "spec.nodeName=idx-n1"},
		{"app=b", "spec.nodeName="},
		{"", "spec.nodeName=idx-n1,status.phase=Pending"}, // the apiserver's index, with another term
		{"", "status.phase=Running"},                      // only the profile indexes it: a scan for the apiserver
		{"app=a", "status.phase=Pending"},
	}
	targets := []listTarget{
		{"/api/v1/pods", pods},
		{"/api/v1/namespaces/idx-1/pods", pods},
		{"/api/v1/namespaces/idx-2/pods", pods[:4]},
		{"/apis/example.cachetier.io/v1/widgets", [][2]string{{"", "spec.color=red"}, {"app=a", "spec.color=blue"}}},
		{"/apis/example.cachetier.io/v1/namespaces/ns-2/widgets", [][2]string{{"", "spec.color=red"}}},
	}
	type rvMode struct{ rv, match string }
	modes := []rvMode{{"", ""}, {"0", ""}, {rv, "NotOlderThan"}, {rv, "Exact"}, {rv, ""}}
	n := 0
	for _, tg := range targets {
		for _, sel := range tg.selectors {
			base := query("labelSelector", sel[0], "fieldSelector", sel[1])
			m := matches(t, tg.path, base)
			limits := []string{"", "1", "3"}
			for _, l := range []int{m - 1, m, m + 1} {
				if l > 3 {
					limits = append(limits, strconv.Itoa(l))
				}
			}
			for _, mode := range modes {
				for _, l := range limits {
					q := query("resourceVersion", mode.rv, "resourceVersionMatch", mode.match, "limit", l, "labelSelector", sel[0], "fieldSelector", sel[1])
					t.Run(tg.path+"?"+q.Encode(), func(t *testing.T) { compareList(t, tg.path, q, "") })
					n++
				}
			}
		}
	}
	t.Logf("compared %d indexed LIST requests (and their continue pages)", n)
}

// TestIndexRulesDiffer pins that the data reaches the case the index is
// about: on the apiserver, a consistent first page holding exactly a
// node's pods has no continuation, and the same page read exactly has one.
func TestIndexRulesDiffer(t *testing.T) {
	testEnv = tiers[0]
	path := "/api/v1/namespaces/idx-1/pods"
	base := query("fieldSelector", "spec.nodeName=idx-n2")
	m := strconv.Itoa(matches(t, path, base))
	rv := currentRV(t)
	for _, c := range []struct {
		q         url.Values
		continues bool
	}{
		{query("fieldSelector", "spec.nodeName=idx-n2", "limit", m), false},
		{query("fieldSelector", "spec.nodeName=idx-n2", "limit", m, "resourceVersion", rv, "resourceVersionMatch", "Exact"), true},
	} {
		r := get(t, testEnv.admin, path, c.q, "")
		var l listView
		if err := json.Unmarshal(r.body, &l); err != nil {
			t.Fatal(err)
		}
		if (l.Metadata.Continue != "") != c.continues {
			t.Fatalf("apiserver %s?%s: continue %q, want continuation %v", path, c.q.Encode(), l.Metadata.Continue, c.continues)
		}
	}
}

// TestIndexMetrics: the standalone tier exports its indexes' sizes and
// counts the LISTs it read through them.
func TestIndexMetrics(t *testing.T) {
	e := tiers[0]
	testEnv = e
	compareList(t, "/api/v1/pods", query("fieldSelector", "spec.nodeName=idx-n1", "limit", "2"), "")
	for _, series := range []string{
		`cachetier_index_entries{index="spec.nodeName",resource="pods"}`,
		`cachetier_index_values{index="spec.nodeName",resource="pods"}`,
		`cachetier_index_bytes{index="spec.nodeName",resource="pods"}`,
		`cachetier_index_entries{index="status.phase",resource="pods"}`,
		`cachetier_index_entries{index="spec.color",resource="widgets.example.cachetier.io"}`,
		`cachetier_indexed_lists_total{index="spec.nodeName",resource="pods"}`,
	} {
		// Index sizes are reported every 5 s.
		var v string
		err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
			var err error
			v, err = e.metric(series)
			f, perr := strconv.ParseFloat(v, 64)
			return err == nil && perr == nil && f > 0, nil
		})
		if err != nil {
			t.Errorf("%s = %q, want a positive number", series, v)
		}
	}
}

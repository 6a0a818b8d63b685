package relist

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// outage is how long the apiserver stays down: long enough for every
// freshness wait (3 s), progress probe and ingestion retry of the tier to
// fail several times over, as in a control-plane upgrade or a lost
// apiserver VM.
const outage = 30 * time.Second

// TestAPIServerOutage: with kube-apiserver down for 30 s, a standalone tier
// and a fleet's front keep serving what they hold — RV=0 LISTs answer with
// the cached objects and open watches stay open — while consistent reads,
// whose freshness cannot be proven, get kube-apiserver's 504
// ResourceVersionTooLarge with Retry-After (never the cached data in their
// place). When the apiserver is back, the tier resumes: the apiserver's new
// watch cache answers the tier's resume with 410, which forces one relist
// per resource and no more, and the next write reaches the watchers that
// stayed open.
func TestAPIServerOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	api := kubernetes.NewForConfigOrDie(env.Admin)
	tiers := map[string]*rest.Config{"standalone": env.TierAdmin, "fleet": env.FleetAdmin}

	type opened struct {
		w     watch.Interface
		names []string
	}
	open := map[string]opened{}
	for name, cfg := range tiers {
		list, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		open[name] = opened{w: w, names: names(list)}
	}
	expiredBefore := metric(t, `cachetier_upstream_relists_total{reason="expired",resource="configmaps"}`)

	start := time.Now()
	err := env.CP.RestartAPIServer(ctx, func(ctx context.Context) error {
		for time.Since(start) < outage {
			for name, cfg := range tiers {
				// RV=0: served from the cache, as kube-apiserver's watch cache
				// serves it.
				l, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
				if err != nil {
					t.Errorf("%s: RV=0 LIST with the apiserver down: %v", name, err)
				} else if got := names(l); strings.Join(got, ",") != strings.Join(open[name].names, ",") {
					t.Errorf("%s: RV=0 LIST with the apiserver down: %v, want %v", name, got, open[name].names)
				}
				// A consistent LIST, read at the HTTP level: client-go would
				// retry the 504 (it has Retry-After) and hide it.
				checkUnprovable(ctx, t, name, cfg)
				// The watch opened before stays open.
				select {
				case ev, ok := <-open[name].w.ResultChan():
					if !ok {
						t.Fatalf("%s: the watch closed with the apiserver down", name)
					}
					if ev.Type != watch.Bookmark {
						t.Errorf("%s: %s event with the apiserver down (nothing was written)", name, ev.Type)
					}
				default:
				}
			}
			time.Sleep(2 * time.Second)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("apiserver restart: %v", err)
	}
	t.Logf("the apiserver was down %s", time.Since(start).Round(time.Second))

	// Back: a write made now reaches the watches opened before the outage.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-outage", Namespace: ns}, Data: map[string]string{"v": "1"}}
	created, err := api.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer api.CoreV1().ConfigMaps(ns).Delete(context.Background(), cm.Name, metav1.DeleteOptions{})
	for name := range tiers {
		deadline := time.After(90 * time.Second)
	events:
		for {
			select {
			case ev, ok := <-open[name].w.ResultChan():
				if !ok {
					t.Fatalf("%s: the watch closed after the apiserver came back", name)
				}
				switch ev.Type {
				case watch.Bookmark:
				case watch.Added:
					if got := ev.Object.(*corev1.ConfigMap); got.Name == cm.Name {
						if got.ResourceVersion != created.ResourceVersion {
							t.Errorf("%s: ADDED %s at RV %s, the apiserver created it at %s", name, cm.Name, got.ResourceVersion, created.ResourceVersion)
						}
						break events
					}
					t.Errorf("%s: unexpected ADDED %s", name, ev.Object.(*corev1.ConfigMap).Name)
				default:
					t.Errorf("%s: unexpected %s event %v", name, ev.Type, ev.Object)
				}
			case <-deadline:
				t.Fatalf("%s: no ADDED %s within 90 s after the apiserver came back", name, cm.Name)
			}
		}
		// Consistent reads are served again, with the write.
		l, err := kubernetes.NewForConfigOrDie(tiers[name]).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: consistent LIST after the outage: %v", name, err)
		}
		if got := names(l); !slices.Contains(got, cm.Name) {
			t.Errorf("%s: consistent LIST after the outage lacks %s: %v", name, cm.Name, got)
		}
	}
	// The restarted apiserver's watch cache starts at its current RV, so
	// the tier's resume got 410 — one relist, forced; the outage itself
	// (refused connections, failed probes and RV fetches) caused none.
	expiredAfter := metric(t, `cachetier_upstream_relists_total{reason="expired",resource="configmaps"}`)
	if n := count(t, expiredAfter) - count(t, expiredBefore); n != 1 {
		t.Errorf("relists on 410 during and after the outage: %d, want 1", n)
	}
	for _, reason := range []string{"startup", "error", "progress"} {
		if m := metric(t, `cachetier_upstream_relists_total{reason="`+reason+`",resource="configmaps"}`); reason == "startup" && m != "1" || reason != "startup" && m != "0" && m != "" {
			t.Errorf("relists{reason=%q}: %s after the outage", reason, m)
		}
	}
}

// checkUnprovable sends a consistent LIST straight over HTTP and checks
// kube-apiserver's answer to a read its watch cache cannot serve in time:
// 504, Retry-After, Status reason Timeout with the ResourceVersionTooLarge
// cause.
func checkUnprovable(ctx context.Context, t *testing.T, name string, cfg *rest.Config) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/namespaces/"+ns+"/configmaps", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Errorf("%s: consistent LIST with the apiserver down: %v", name, err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("%s: consistent LIST with the apiserver down: %d %s, want 504", name, resp.StatusCode, body)
		return
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Errorf("%s: 504 without Retry-After", name)
	}
	var st metav1.Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Errorf("%s: 504 body is not a Status: %v: %s", name, err, body)
		return
	}
	if st.Reason != metav1.StatusReasonTimeout || st.Details == nil || len(st.Details.Causes) == 0 || st.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge || st.Details.RetryAfterSeconds < 1 {
		t.Errorf("%s: 504 Status %+v, want reason Timeout, cause ResourceVersionTooLarge, retryAfterSeconds", name, st)
	}
}

func names(l *corev1.ConfigMapList) []string {
	var out []string
	for _, cm := range l.Items {
		out = append(out, cm.Name)
	}
	sort.Strings(out)
	return out
}

// count reads a counter's value; a series not yet exported is 0.
func count(t *testing.T, v string) int {
	t.Helper()
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("counter value %q: %v", v, err)
	}
	return n
}

package kubectl

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFleetAggregated: the operator's fleet shape as real processes —
// `cache-server shard` ×2 and `cache-server front` with the flags the
// operator's pods use — registered with the real aggregator. kubectl
// through it answers as the apiserver does, paginated and not, and the
// probe and metrics ports answer.
func TestFleetAggregated(t *testing.T) {
	if !strings.HasSuffix(aggURL(t, fleetKubeconfig), "/apis/"+fleetProfile+".cache.cachetier.io/v1alpha1/watch") {
		t.Fatalf("fleet kubeconfig server URL does not end in the profile's prefix")
	}
	for _, c := range getCases {
		t.Run(c.name, func(t *testing.T) {
			compareJSON(t, fleetKubeconfig, c.args...)
		})
	}
	t.Run("chunked", func(t *testing.T) {
		args := []string{"get", "configmaps", "-A", "--chunk-size=50", "-o", "name"}
		got := mustKubectl(t, fleetKubeconfig, args...)
		if want := mustKubectl(t, env.CP.AdminKubeconfig, args...); got != want {
			t.Fatalf("output differs from the apiserver's:\n%s\nwant:\n%s", clip(got), clip(want))
		}
	})
	t.Run("writes refused", func(t *testing.T) {
		r := kubectl(t, fleetKubeconfig, "delete", "configmap", "cm-000", "-n", "ns-0")
		if r.err == nil || !strings.Contains(r.stderr, "cachetier serves a read-only cache") {
			t.Fatalf("want the tier's read-only refusal through the aggregator, got %s", r)
		}
	})
	t.Run("probes and metrics", func(t *testing.T) {
		for _, u := range append([]string{fleet.FrontMetricsURL}, fleet.ShardMetricsURLs...) {
			for _, path := range []string{"/readyz", "/livez"} {
				if body := httpGet(t, u+path); body != "ok" {
					t.Errorf("%s%s: %q", u, path, body)
				}
			}
		}
		front := httpGet(t, fleet.FrontMetricsURL+"/metrics")
		for _, series := range []string{`cachetier_fleet_shard_watermark{resource="configmaps",shard="fleet-shard-0"}`, `cachetier_fleet_shard_calls_total{outcome="ok",shard="fleet-shard-1",verb="list"}`} {
			if !strings.Contains(front, series) {
				t.Errorf("front /metrics lacks %s", series)
			}
		}
		shard := httpGet(t, fleet.ShardMetricsURLs[0]+"/metrics")
		if !strings.Contains(shard, `cachetier_shard_requests_total{outcome="ok",resource="configmaps",verb="list"}`) {
			t.Errorf("shard /metrics lacks its served list requests")
		}
		// What the alerts (internal/alerts) read: the apiserver's answers
		// to the tier, and the served certificate's expiry (the fleet's
		// certificate is fresh: it expires in the future, within a year).
		for role, body := range map[string]string{"front": front, "shard": shard} {
			if v, ok := sampleValue(body, `cachetier_upstream_responses_total{code="200"}`); !ok || v < 1 {
				t.Errorf("%s: cachetier_upstream_responses_total{code=\"200\"} = %v, %v; want the apiserver's answers counted", role, v, ok)
			}
			v, ok := sampleValue(body, "cachetier_serving_certificate_expiry_timestamp_seconds")
			if left := time.Until(time.Unix(int64(v), 0)); !ok || left <= 0 || left > 366*24*time.Hour {
				t.Errorf("%s: cachetier_serving_certificate_expiry_timestamp_seconds = %v (%v left), %v", role, v, left, ok)
			}
		}
	})
}

// sampleValue finds one sample of the Prometheus text format by its exact
// series (name and labels as the exporter writes them).
func sampleValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

package upstreamhttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"
)

func TestCountsResponsesByCode(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/forbidden" {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	responses := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "responses_total", Help: "h"}, []string{"code"})
	cfg := Instrument(&rest.Config{Host: srv.URL}, responses)
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/ok", "/ok", "/forbidden"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// A canceled call is the caller leaving: not counted.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/ok", nil)
	if _, err := client.Do(req); err == nil {
		t.Fatal("canceled request succeeded")
	}
	// Nothing listening: no response at all.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	if _, err := client.Get(dead.URL); err == nil {
		t.Fatal("request to a closed server succeeded")
	}
	for code, want := range map[string]float64{"200": 2, "403": 1, "error": 1} {
		if got := testutil.ToFloat64(responses.WithLabelValues(code)); got != want {
			t.Errorf("code %s: %v responses, want %v", code, got, want)
		}
	}
}

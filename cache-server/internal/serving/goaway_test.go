package serving

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/cache-server/internal/http2server"
)

// TestGoawayMovesHTTP2Clients runs real HTTP/2 (and HTTP/1.1) over TLS and
// counts the connections a Go client — the aggregator's transport — opens
// for consecutive requests.
func TestGoawayMovesHTTP2Clients(t *testing.T) {
	for _, c := range []struct {
		name      string
		chance    float64
		http2     bool
		wantConns int
		wantSent  float64
	}{
		{"always, HTTP/2: a new connection per request", 1, true, 4, 4},
		{"never, HTTP/2: one connection", 0, true, 1, 0},
		{"always, HTTP/1.1: untouched (no GOAWAY in HTTP/1.1)", 1, false, 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			sent := prometheus.NewCounter(prometheus.CounterOpts{Name: "goaways"})
			srv := httptest.NewUnstartedServer(withGoaway(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, r.Proto)
			}), c.chance, sent))
			srv.EnableHTTP2 = c.http2
			if c.http2 {
				// The HTTP/2 server the roles run.
				if err := http2server.Configure(srv.Config); err != nil {
					t.Fatal(err)
				}
			}
			srv.StartTLS()
			defer srv.Close()
			client := srv.Client()
			if !c.http2 {
				tr := client.Transport.(*http.Transport).Clone()
				tr.ForceAttemptHTTP2 = false
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
				client = &http.Client{Transport: tr}
			}
			conns := 0
			trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					conns++
				}
			}}
			for range 4 {
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[c.http2]; string(body) != want {
					t.Fatalf("served over %s, want %s", body, want)
				}
			}
			if conns != c.wantConns {
				t.Errorf("%d connections for 4 requests, want %d", conns, c.wantConns)
			}
			if got := testutil.ToFloat64(sent); got != c.wantSent {
				t.Errorf("goaways counted %v, want %v", got, c.wantSent)
			}
		})
	}
}

func TestValidateGoawayChance(t *testing.T) {
	for chance, ok := range map[float64]bool{0: true, 0.01: true, MaxGoawayChance: true, -0.1: false, 0.5: false} {
		if err := ValidateGoawayChance(chance); (err == nil) != ok {
			t.Errorf("ValidateGoawayChance(%v) = %v", chance, err)
		}
	}
}

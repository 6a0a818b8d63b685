package serving

import (
	"fmt"
	"math/rand/v2"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxGoawayChance is kube-apiserver's bound for --goaway-chance: above it
// clients would reconnect (a TLS handshake) more often than they gain.
const MaxGoawayChance = 0.02

// ValidateGoawayChance refuses a chance outside [0, MaxGoawayChance].
func ValidateGoawayChance(chance float64) error {
	if chance < 0 || chance > MaxGoawayChance {
		return fmt.Errorf("--goaway-chance must be between 0 and %v, got %v", MaxGoawayChance, chance)
	}
	return nil
}

// withGoaway asks an HTTP/2 client to move to a new connection after a
// fraction chance of its requests, as kube-apiserver's --goaway-chance.
//
// Why a front needs it: kube-apiserver's aggregator proxies every request
// for an APIService over one HTTP/2 connection to the Service's ClusterIP
// (unless the cluster runs it with --enable-aggregator-routing), and
// kube-proxy balances connections, not requests. On a real node all reads
// of a 2-front fleet reached one front and the other served none, however
// often fronts were replaced. "Connection: close" on an HTTP/2 response
// makes Go's server send GOAWAY: streams in flight (watches included) run
// to their end, and the aggregator dials again for the next request,
// landing on a front kube-proxy picks.
func withGoaway(inner http.Handler, chance float64, sent prometheus.Counter) http.Handler {
	if chance <= 0 {
		return inner
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && rand.Float64() < chance {
			w.Header().Set("Connection", "close")
			sent.Inc()
		}
		inner.ServeHTTP(w, r)
	})
}

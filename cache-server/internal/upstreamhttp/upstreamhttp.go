// Package upstreamhttp instruments the tier's client of the apiserver: every
// response is counted by status code, so that a 401 or 403 (a revoked
// token, RBAC that no longer allows the cached resources, TokenReview or
// SubjectAccessReview) shows up as a metric an alert can watch rather than
// only as retries in the log.
package upstreamhttp

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// Instrument returns a copy of cfg whose transport counts responses on
// responses (label code: the HTTP status, or "error" when the call got no
// response).
func Instrument(cfg *rest.Config, responses *prometheus.CounterVec) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return counting{next: rt, responses: responses}
	})
	return out
}

type counting struct {
	next      http.RoundTripper
	responses *prometheus.CounterVec
}

func (c counting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		// A canceled watch is the caller leaving, not the apiserver failing.
		if req.Context().Err() == nil {
			c.responses.WithLabelValues("error").Inc()
		}
		return resp, err
	}
	c.responses.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
	return resp, nil
}

package auth

// Impersonation on the tier's own endpoint.
//
// Why: a client that talks to the tier directly (not through the
// aggregator, which impersonates itself and forwards only the resulting
// identity) may send Impersonate-User/-Group/-Uid/-Extra-* (kubectl --as).
// Without this filter the tier authorized such a request as the caller and
// answered it: a request meant to be answered as someone with less access
// got the caller's view. kube-apiserver 1.37 (ConstrainedImpersonation,
// beta and on by default since 1.36) decides these requests with
// impersonation.WithConstrainedImpersonation: SubjectAccessReviews for the
// impersonate verbs (legacy "impersonate" on users/groups/uids/userextras
// and the constrained impersonate:* / impersonate-on:* verbs), then the
// request is authorized as the impersonated user. The tier uses that very
// filter at the same place in the chain (after authentication, before
// authorization), so answers and refusals are the apiserver's.

import (
	"net/http"
	"strings"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/filters/impersonation"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// withImpersonation puts kube-apiserver's impersonation filter in front of
// next and reports its refusals: a log line naming the caller and whom they
// asked to be, and results counted by outcome (allowed, forbidden, invalid,
// error) when results is set.
func withImpersonation(next http.Handler, a authorizer.UnconditionalAuthorizer, s runtime.NegotiatedSerializer, log logr.Logger, results *prometheus.CounterVec) http.Handler {
	// reached runs between the filter and next: only requests the filter
	// let through get there, with the recorder the outer handler passed in;
	// next gets the original writer (watches need its Flusher).
	reached := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rec, ok := w.(*impersonationRecorder); ok {
			rec.reached = true
			w = rec.ResponseWriter
		}
		next.ServeHTTP(w, r)
	})
	filter := impersonation.WithConstrainedImpersonation(reached, a, s)
	count := func(result string) {
		if results != nil {
			results.WithLabelValues(result).Inc()
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !impersonating(r.Header) {
			filter.ServeHTTP(w, r)
			return
		}
		// The filter removes the headers; keep what the log line needs.
		wanted := r.Header.Get(authenticationv1.ImpersonateUserHeader)
		groups := r.Header.Values(authenticationv1.ImpersonateGroupHeader)
		uid := r.Header.Get(authenticationv1.ImpersonateUIDHeader)
		rec := &impersonationRecorder{ResponseWriter: w}
		filter.ServeHTTP(rec, r)
		if rec.reached {
			count("allowed")
			return
		}
		result := "error"
		switch rec.code {
		case http.StatusForbidden:
			result = "forbidden"
		case http.StatusBadRequest:
			result = "invalid"
		}
		count(result)
		var caller user.Info = &user.DefaultInfo{}
		if u, ok := request.UserFrom(r.Context()); ok {
			caller = u
		}
		log.Info("impersonation refused", "code", rec.code, "method", r.Method, "path", r.URL.Path,
			"caller", caller.GetName(), "callerGroups", caller.GetGroups(),
			"impersonateUser", wanted, "impersonateGroups", groups, "impersonateUID", uid)
	})
}

// impersonating reports whether the request carries any impersonation
// header (the filter refuses groups, UID or extras without a user name).
func impersonating(h http.Header) bool {
	for name := range h {
		switch {
		case name == authenticationv1.ImpersonateUserHeader, name == authenticationv1.ImpersonateGroupHeader,
			name == authenticationv1.ImpersonateUIDHeader:
			return true
		case strings.HasPrefix(name, authenticationv1.ImpersonateUserExtraHeaderPrefix):
			return true
		}
	}
	return false
}

// impersonationRecorder sees the filter's answer when it refuses; it never
// reaches the handlers behind the filter (reached unwraps it).
type impersonationRecorder struct {
	http.ResponseWriter
	code    int
	reached bool
}

func (r *impersonationRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *impersonationRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

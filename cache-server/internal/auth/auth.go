// Package auth puts the apiserver's delegated authentication and
// authorization in front of the tier, built from k8s.io/apiserver's own
// pieces rather than hand-written header checks:
//
//   - identity from the aggregator comes only with a client certificate
//     that verifies against the request-header CA and carries an allowed
//     name (then X-Remote-User/-Group/-Extra-* are trusted);
//   - direct clients authenticate with a client certificate from the
//     cluster's client CA or a bearer token checked by TokenReview;
//   - a request with Impersonate-* headers (kubectl --as) goes through the
//     apiserver's impersonation filter (impersonation.go) and is then
//     authorized as the impersonated user, or refused as the apiserver
//     refuses it;
//   - every request is authorized by SubjectAccessReview against the
//     apiserver for the resource it reads (the path below the aggregated
//     prefix), so nobody reads through the tier what they could not read
//     from the apiserver.
package auth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	genericfilters "k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/cachetier/cachetier/cache-server/internal/deadline"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// ClientFor is the client for the TokenReviews and SubjectAccessReviews
// of the chain: cfg with k8s.io/apiserver's delegated-auth limits (QPS
// 200, burst 400; options.DelegatingAuthorizationOptions). client-go's
// default of 5 QPS made the answers to distinct callers queue behind each
// other: every kubelet is its own user and every node-scoped read its
// own authorization (the field selector is one of its attributes), so
// 2,000 node watchers took minutes to open.
func ClientFor(cfg *rest.Config) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 200, 400
	return kubernetes.NewForConfig(c)
}

// Options configure the delegated auth chain.
type Options struct {
	// Client sends the TokenReviews and SubjectAccessReviews; build it
	// with ClientFor.
	Client kubernetes.Interface
	// Paths are the profile's aggregated paths: a request below one is
	// authorized as the Kubernetes path below it (see front.Options.Paths).
	Paths aggpath.Paths
	// AlwaysAllowPaths skip authentication and authorization (probes).
	AlwaysAllowPaths []string
	// CacheTTL for TokenReview and SubjectAccessReview answers.
	CacheTTL time.Duration
	// ConnCacheResults, when set, counts the per-connection cache's
	// answers by result: hit, miss, bypass (see conncache.go).
	ConnCacheResults *prometheus.CounterVec
	// LastKnownAnswers, when set, counts reviews answered from the last
	// known answers while the apiserver was unreachable (lastknown.go), by
	// review and result (reused, none).
	LastKnownAnswers *prometheus.CounterVec
	// SelectorAuthorizations, when set, counts the authorizations of
	// requests with field or label selectors by how they were decided:
	// broad, narrow, node (selectors.go).
	SelectorAuthorizations *prometheus.CounterVec
	// AuthorizationRenewals, when set, counts the renewals of
	// authorization answers in use before they expire, by result:
	// renewed, failed (renewal.go).
	AuthorizationRenewals *prometheus.CounterVec
	// ImpersonationResults, when set, counts requests with impersonation
	// headers by result: allowed, forbidden, invalid, error.
	ImpersonationResults *prometheus.CounterVec
	// Log receives a line for every refused impersonation.
	Log logr.Logger
	// PriorityAndFairness, when set, is the priority-and-fairness filter
	// (package apf), put where kube-apiserver puts it: after
	// authentication and impersonation, before authorization.
	PriorityAndFairness func(http.Handler) http.Handler
	// RequestTimeout, when set, bounds every request but a watch (package
	// deadline), put after authentication and impersonation so that
	// TimedOut knows the user; TimedOut (optional) hears of the requests
	// cut.
	RequestTimeout time.Duration
	TimedOut       func(r *http.Request)
}

// Wrap returns handler behind authentication and authorization, and the TLS
// client-auth mode the server must use so clients can present certificates.
// The server should set ConnContext as its http.Server.ConnContext, which
// lets authentication answers be reused within a connection.
func Wrap(ctx context.Context, opts Options, handler http.Handler) (http.Handler, tls.ClientAuthType, error) {
	cm, err := opts.Client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("read kube-system/extension-apiserver-authentication (the tier needs RBAC to read it): %w", err)
	}
	ttl := opts.CacheTTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	// Bearer tokens' answers are the library's token cache's, not renewed
	// (renewal.go says why).
	cfg := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  opts.Client.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      options.DefaultAuthWebhookRetryBackoff(),
		CacheTTL:                 ttl,
	}
	if ca := cm.Data["client-ca-file"]; ca != "" {
		if cfg.ClientCertificateCAContentProvider, err = dynamiccertificates.NewStaticCAContent("client-ca", []byte(ca)); err != nil {
			return nil, 0, fmt.Errorf("client-ca-file: %w", err)
		}
	}
	var rh *authenticatorfactory.RequestHeaderConfig
	if ca := cm.Data["requestheader-client-ca-file"]; ca != "" {
		caProvider, err := dynamiccertificates.NewStaticCAContent("requestheader-client-ca", []byte(ca))
		if err != nil {
			return nil, 0, fmt.Errorf("requestheader-client-ca-file: %w", err)
		}
		list := func(key string) headerrequest.StringSliceProvider {
			var v []string
			if raw := cm.Data[key]; raw != "" {
				_ = json.Unmarshal([]byte(raw), &v)
			}
			return headerrequest.StaticStringSlice(v)
		}
		rh = &authenticatorfactory.RequestHeaderConfig{
			UsernameHeaders:     list("requestheader-username-headers"),
			UIDHeaders:          list("requestheader-uid-headers"),
			GroupHeaders:        list("requestheader-group-headers"),
			ExtraHeaderPrefixes: list("requestheader-extra-headers-prefix"),
			CAContentProvider:   caProvider,
			AllowedClientNames:  list("requestheader-allowed-names"),
		}
		cfg.RequestHeaderConfig = rh
	}
	authn, _, err := cfg.New()
	if err != nil {
		return nil, 0, fmt.Errorf("build authenticator: %w", err)
	}
	// Reuse successful answers within a connection (see conncache.go); only
	// active on servers whose ConnContext is ConnContext.
	authn = &lastKnownTokens{inner: authn, answers: newLastKnown[*authenticator.Response]("tokenreview", opts.LastKnownAnswers, opts.Log)}
	cached := newConnCachingAuthenticator(authn, rh, ttl)
	cached.results = opts.ConnCacheResults
	authn = cached
	// The library's own cache is off (a TTL of 0 expires every answer at
	// once): renewingAuthorizer keeps the answers, and its renewals must
	// reach the apiserver (renewal.go).
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: opts.Client.AuthorizationV1(),
		WebhookRetryBackoff:       options.DefaultAuthWebhookRetryBackoff(),
	}.New()
	if err != nil {
		return nil, 0, fmt.Errorf("build authorizer: %w", err)
	}
	authz = &renewingAuthorizer{inner: authz, answers: newRenewingAnswers(ttl, clock.RealClock{}, opts.AuthorizationRenewals, opts.Log)}
	authz = &lastKnownAuthorizer{inner: authz, answers: newLastKnown[authzAnswer]("subjectaccessreview", opts.LastKnownAnswers, opts.Log)}
	authz = &selectorsNarrow{inner: authz, results: opts.SelectorAuthorizations}
	resolver := &prefixResolver{paths: opts.Paths, factory: &request.RequestInfoFactory{
		APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api"),
	}}
	h := chain(handler, authn, authz, rh, resolver, opts)
	always := sets.NewString(opts.AlwaysAllowPaths...)
	chain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if always.Has(r.URL.Path) {
			handler.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
	return chain, tls.RequestClientCert, nil
}

// chain puts handler behind the filters in the order kube-apiserver's
// DefaultBuildHandlerChain uses (k8s.io/apiserver/pkg/server/config.go):
// the request's receipt time (a consistent read may use an RV fetch that
// started after it: package coalesce), request info, authentication,
// impersonation, priority and fairness, authorization — with the request deadline after impersonation (the
// apiserver's is outside authentication; here it is inside so that a cut
// request is logged with its user; only its clock starts later, by the
// authentication's time).
func chain(handler http.Handler, authn authenticator.Request, authz authorizer.Authorizer, rh *authenticatorfactory.RequestHeaderConfig, resolver request.RequestInfoResolver, opts Options) http.Handler {
	codecs := scheme.Codecs
	h := genericfilters.WithAuthorization(handler, authz, codecs)
	if opts.PriorityAndFairness != nil {
		h = opts.PriorityAndFairness(h)
	}
	if opts.RequestTimeout > 0 {
		h = deadline.Filter(h, opts.RequestTimeout, opts.TimedOut)
	}
	h = withImpersonation(h, authz, codecs, opts.Log, opts.ImpersonationResults)
	h = genericfilters.WithAuthentication(h, authn, genericfilters.Unauthorized(codecs), nil, rh)
	return genericfilters.WithRequestReceivedTimestamp(genericfilters.WithRequestInfo(h, resolver))
}

// prefixResolver classifies the request as the resource it reads: a GET of
// /apis/<profile>.cache.cachetier.io/v1alpha1/watch/api/v1/pods is "list
// pods". The group-version's own path (the aggregator's discovery) keeps its
// classification, a non-resource URL.
type prefixResolver struct {
	paths   aggpath.Paths
	factory *request.RequestInfoFactory
}

func (p *prefixResolver) NewRequestInfo(r *http.Request) (*request.RequestInfo, error) {
	if rest, under := p.paths.Strip(r.URL.Path); under != "" && rest != "" {
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		return p.factory.NewRequestInfo(r2)
	}
	return p.factory.NewRequestInfo(r)
}

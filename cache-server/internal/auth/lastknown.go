package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/utils/clock"
)

// The tier authenticates bearer tokens and authorizes every request by
// asking the apiserver (TokenReview, SubjectAccessReview). kube-apiserver
// itself keeps authorizing while etcd is unreachable — its RBAC
// authorizer reads an informer cache — and keeps serving its watch cache;
// the tier, asking the apiserver, would turn every read into a 500 ten
// seconds (the review caches' TTL) into an apiserver outage, although it
// holds the data. So while the apiserver does not answer, the tier reuses
// the answer it last got for the same request attributes (the same token),
// if that answer is at most lastKnownMaxAge old. Nobody can change RBAC or
// delete a ServiceAccount through an apiserver that is down; an answer the
// apiserver gives (a 4xx included) is never replaced by an older one.
const (
	lastKnownMaxAge = 5 * time.Minute
	// lastKnownMaxEntries bounds the memory: a few hundred bytes each. A
	// tier serving more distinct callers than this keeps the ones it saw
	// last (an entry is dropped when the map is full).
	lastKnownMaxEntries = 20000
)

// unavailable tells a failure to reach the apiserver (refused, reset,
// timed out, a 5xx or 429 it answered) from an answer. Errors that carry
// an answer — a TokenReview's status.error for a deleted ServiceAccount, a
// 403 — are not: they must win over any kept answer.
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	if agg, ok := err.(utilerrors.Aggregate); ok {
		// The union of authenticators: unavailable only if one of its
		// parts failed for want of the apiserver.
		for _, e := range agg.Errors() {
			if unavailable(e) {
				return true
			}
		}
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := st.Status().Code
		return code == http.StatusTooManyRequests || code >= 500
	}
	var urlErr *url.Error
	var netErr net.Error
	return errors.As(err, &urlErr) || errors.As(err, &netErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded)
}

// lastKnown keeps answers by key with their time.
type lastKnown[V any] struct {
	review string // the metric's label: subjectaccessreview, tokenreview
	used   *prometheus.CounterVec
	log    logr.Logger
	clock  clock.PassiveClock

	mu      sync.Mutex
	entries map[string]lastKnownEntry[V]
	logged  time.Time
	// down is when a review last failed for want of the apiserver: for
	// lastKnownRetry after it, kept answers are used without asking — each
	// ask retries for seconds (the webhook's backoff) before it fails.
	down time.Time
}

// lastKnownRetry is how long after a failed review kept answers are used
// without asking the apiserver again.
const lastKnownRetry = 5 * time.Second

type lastKnownEntry[V any] struct {
	v  V
	at time.Time
}

func newLastKnown[V any](review string, used *prometheus.CounterVec, log logr.Logger) *lastKnown[V] {
	return &lastKnown[V]{review: review, used: used, log: log, clock: clock.RealClock{}, entries: map[string]lastKnownEntry[V]{}}
}

func (l *lastKnown[V]) put(key string, v V) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.entries[key]; !ok && len(l.entries) >= lastKnownMaxEntries {
		for k := range l.entries {
			delete(l.entries, k)
			break
		}
	}
	l.entries[key] = lastKnownEntry[V]{v: v, at: l.clock.Now()}
}

// kept returns key's answer without asking while the apiserver was found
// unreachable in the last lastKnownRetry.
func (l *lastKnown[V]) kept(key string) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var zero V
	now := l.clock.Now()
	if l.down.IsZero() || now.Sub(l.down) > lastKnownRetry {
		return zero, false
	}
	e, ok := l.entries[key]
	if !ok || now.Sub(e.at) > lastKnownMaxAge {
		return zero, false
	}
	if l.used != nil {
		l.used.WithLabelValues(l.review, "reused").Inc()
	}
	return e.v, true
}

// get returns the answer kept for key when it is young enough, counting
// and (at most every 10 s) logging that it was reused because of err.
func (l *lastKnown[V]) get(key string, err error) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	now := l.clock.Now()
	l.down = now
	if !ok || now.Sub(e.at) > lastKnownMaxAge {
		var zero V
		if l.used != nil {
			l.used.WithLabelValues(l.review, "none").Inc()
		}
		return zero, false
	}
	if l.used != nil {
		l.used.WithLabelValues(l.review, "reused").Inc()
	}
	if now.Sub(l.logged) >= 10*time.Second {
		l.logged = now
		l.log.Info("the apiserver does not answer reviews; reusing the last answers it gave (at most 5m old)", "review", l.review, "age", now.Sub(e.at).Round(time.Second).String(), "error", err.Error())
	}
	return e.v, true
}

// lastKnownAuthorizer is an authorizer.Authorizer that falls back on the
// last answer for the same attributes while inner cannot reach the
// apiserver.
type lastKnownAuthorizer struct {
	inner   authorizer.Authorizer
	answers *lastKnown[authzAnswer]
}

type authzAnswer struct {
	decision authorizer.Decision
	reason   string
}

func (a *lastKnownAuthorizer) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	key := attributesKey(attrs)
	if ans, ok := a.answers.kept(key); ok {
		return ans.decision, ans.reason, nil
	}
	d, reason, err := a.inner.Authorize(ctx, attrs)
	if err == nil {
		a.answers.put(key, authzAnswer{d, reason})
		return d, reason, nil
	}
	if unavailable(err) {
		if ans, ok := a.answers.get(key, err); ok {
			return ans.decision, ans.reason, nil
		}
	}
	return d, reason, err
}

// ConditionsAwareAuthorize is Authorize, as the interface asks of an
// authorizer that is not conditions-aware: the tier serves reads only.
func (a *lastKnownAuthorizer) ConditionsAwareAuthorize(ctx context.Context, attrs authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, attrs))
}

// EvaluateConditions fails closed, as the interface asks.
func (a *lastKnownAuthorizer) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

// attributesKey is everything a SubjectAccessReview is asked about (the
// fields of webhook.SubjectAccessReview's spec), so that an answer is only
// reused for the same question.
func attributesKey(a authorizer.Attributes) string {
	var b strings.Builder
	w := func(s string) { b.WriteString(s); b.WriteByte(0) }
	if u := a.GetUser(); u != nil {
		w(u.GetName())
		w(u.GetUID())
		w(strings.Join(u.GetGroups(), "\x01"))
		// In a fixed order: the same question must give the same key.
		extra := u.GetExtra()
		for _, k := range slices.Sorted(maps.Keys(extra)) {
			w(k + "=" + strings.Join(extra[k], "\x01"))
		}
	}
	w(a.GetVerb())
	w(a.GetNamespace())
	w(a.GetAPIGroup())
	w(a.GetAPIVersion())
	w(a.GetResource())
	w(a.GetSubresource())
	w(a.GetName())
	w(a.GetPath())
	if a.IsResourceRequest() {
		w("resource")
	}
	if fs, err := a.GetFieldSelector(); err == nil {
		for _, r := range fs {
			w(r.Field + string(r.Operator) + r.Value)
		}
	}
	if ls, err := a.GetLabelSelector(); err == nil {
		for _, r := range ls {
			w(r.String())
		}
	}
	return b.String()
}

// lastKnownTokens is an authenticator.Request that falls back on the last
// successful authentication of the same bearer token while inner cannot
// reach the apiserver. Only successes are kept (a refused token is refused
// again), keyed by the token's SHA-256, not the token.
type lastKnownTokens struct {
	inner   authenticator.Request
	answers *lastKnown[*authenticator.Response]
}

func (a *lastKnownTokens) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	key := ""
	if h := req.Header.Get("Authorization"); strings.HasPrefix(h, "Bearer ") {
		sum := sha256.Sum256([]byte(h))
		key = string(sum[:])
		if kept, found := a.answers.kept(key); found {
			return kept, true, nil
		}
	}
	resp, ok, err := a.inner.AuthenticateRequest(req)
	if key == "" {
		return resp, ok, err
	}
	if err == nil && ok {
		a.answers.put(key, resp)
		return resp, ok, err
	}
	if err != nil && unavailable(err) {
		if kept, found := a.answers.get(key, err); found {
			return kept, true, nil
		}
	}
	return resp, ok, err
}

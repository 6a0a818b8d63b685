package auth

// Authorization answers renewed before they expire.
//
// Why: the tier asks the apiserver (a SubjectAccessReview) about each
// distinct set of request attributes and keeps the answer for the cache TTL
// (10 s, k8s.io/apiserver's delegated-authorization default). With the
// library's cache alone, the first request after an answer expired waited
// for a new review: a kubelet's LIST of its node's Pods every second paid a
// round trip to the apiserver once in ten, and with the tier's cores busy
// serving a flood of other clients that round trip was the slowest part of
// the request (hack/bench -mode flood: the victims' p99 was that request).
// kube-apiserver authorizes in process and has no such round trip.
//
// So an answer in use is renewed before it expires: a request that finds
// its answer in the last quarter of the TTL is answered from it and starts
// one review in the background, whose answer replaces it. An answer is
// never used longer than the TTL after its review was sent, so revoked
// RBAC is refused within the TTL as before; an answer nobody asks for
// expires as before and costs no review. A failed renewal leaves the answer
// to expire; the next request then asks itself (and falls back on the last
// known answer when the apiserver is unreachable: lastknown.go).

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/utils/clock"
)

const (
	// renewalMaxEntries bounds the answers kept, as k8s.io/apiserver's
	// webhook authorizer bounds its cache (least recently used dropped).
	renewalMaxEntries = 8192
	// renewalMaxAttributes: attributes this long (a huge name or path) are
	// not kept, the webhook authorizer's rule (its shouldCache).
	renewalMaxAttributes = 10000
	// renewalTimeout bounds a renewal; the request that started it does
	// not wait for it.
	renewalTimeout = 10 * time.Second
)

// renewingAuthorizer keeps inner's answers for ttl and renews those in use
// before they expire (see above). inner must not cache: a renewal must
// reach the apiserver.
type renewingAuthorizer struct {
	inner authorizer.Authorizer
	ttl   time.Duration
	clock clock.Clock
	// renewals counts renewals by result: renewed, failed (may be nil).
	renewals *prometheus.CounterVec
	log      logr.Logger
	// inFlight lets tests wait for the renewals started.
	inFlight sync.WaitGroup

	answers *cache.LRUExpireCache // attributesKey → renewableAnswer

	// mu guards renewing and orders the answers' updates (keep).
	mu       sync.Mutex
	renewing map[string]struct{}
}

type renewableAnswer struct {
	decision authorizer.Decision
	reason   string
	// asked is when the review was sent: the answer may describe RBAC as
	// it was then, so its age counts from there.
	asked time.Time
}

func newRenewingAuthorizer(inner authorizer.Authorizer, ttl time.Duration, c clock.Clock, renewals *prometheus.CounterVec, log logr.Logger) *renewingAuthorizer {
	return &renewingAuthorizer{
		inner: inner, ttl: ttl, clock: c, renewals: renewals, log: log,
		answers:  cache.NewLRUExpireCacheWithClock(renewalMaxEntries, c),
		renewing: map[string]struct{}{},
	}
}

func (a *renewingAuthorizer) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	if !keepable(attrs) {
		return a.inner.Authorize(ctx, attrs)
	}
	key := attributesKey(attrs)
	if v, ok := a.answers.Get(key); ok {
		ans := v.(renewableAnswer)
		if a.clock.Since(ans.asked) >= a.ttl-a.ttl/4 {
			a.renew(ctx, key, attrs)
		}
		return ans.decision, ans.reason, nil
	}
	asked := a.clock.Now()
	d, reason, err := a.inner.Authorize(ctx, attrs)
	if err == nil {
		a.keep(key, renewableAnswer{d, reason, asked})
	}
	return d, reason, err
}

// keep stores ans until ttl after it was asked for, unless a later
// review's answer is kept already: a renewal held up past the expiry
// returns after the request that asked again.
func (a *renewingAuthorizer) keep(key string, ans renewableAnswer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.answers.Get(key); ok && v.(renewableAnswer).asked.After(ans.asked) {
		return
	}
	if left := a.ttl - a.clock.Since(ans.asked); left > 0 {
		a.answers.Add(key, ans, left)
	}
}

// renew asks inner about attrs again in the background, unless a renewal
// of key is already on its way.
func (a *renewingAuthorizer) renew(ctx context.Context, key string, attrs authorizer.Attributes) {
	a.mu.Lock()
	if _, busy := a.renewing[key]; busy {
		a.mu.Unlock()
		return
	}
	a.renewing[key] = struct{}{}
	a.mu.Unlock()
	a.inFlight.Add(1)
	go func() {
		defer a.inFlight.Done()
		defer func() {
			a.mu.Lock()
			delete(a.renewing, key)
			a.mu.Unlock()
		}()
		// The request may end first; the renewal is the cache's.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), renewalTimeout)
		defer cancel()
		asked := a.clock.Now()
		d, reason, err := a.inner.Authorize(rctx, attrs)
		if err != nil {
			a.count("failed")
			a.log.V(2).Info("renewing an authorization answer failed; it expires unrenewed", "user", userName(attrs), "verb", attrs.GetVerb(), "resource", attrs.GetResource(), "error", err.Error())
			return
		}
		a.count("renewed")
		a.keep(key, renewableAnswer{d, reason, asked})
	}()
}

func (a *renewingAuthorizer) count(result string) {
	if a.renewals != nil {
		a.renewals.WithLabelValues(result).Inc()
	}
}

// ConditionsAwareAuthorize is Authorize, as the interface asks of an
// authorizer that is not conditions-aware: the tier serves reads only.
func (a *renewingAuthorizer) ConditionsAwareAuthorize(ctx context.Context, attrs authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(a.Authorize(ctx, attrs))
}

// EvaluateConditions fails closed, as the interface asks.
func (a *renewingAuthorizer) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

// keepable is the webhook authorizer's rule for what it caches: the
// request's own attributes (not the user's) are short.
func keepable(a authorizer.Attributes) bool {
	n := len(a.GetNamespace()) + len(a.GetVerb()) + len(a.GetAPIGroup()) + len(a.GetAPIVersion()) +
		len(a.GetResource()) + len(a.GetSubresource()) + len(a.GetName()) + len(a.GetPath())
	return n < renewalMaxAttributes
}

func userName(a authorizer.Attributes) string {
	if u := a.GetUser(); u != nil {
		return u.GetName()
	}
	return ""
}

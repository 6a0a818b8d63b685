package auth

// Authorization answers renewed before they expire.
//
// Why: the tier asks the apiserver (a SubjectAccessReview) about each
// distinct set of request attributes and keeps the answer for the cache TTL
// (10 s, k8s.io/apiserver's delegated-authorization default). With the
// library's cache, the first request after an answer expired waited for a
// new review: a kubelet's LIST of its node's Pods every second paid a round
// trip to the apiserver once in ten, and with the tier's cores busy serving
// a flood of other clients that round trip was the slowest part of the
// request (hack/bench -mode flood). kube-apiserver authorizes in process
// and has no such round trip.
//
// So an answer in use is renewed before it expires: a request that finds
// its answer in the last quarter of the TTL is answered from it and starts
// one review in the background, whose answer replaces it. An answer is
// never used longer than the TTL after its review was sent, so revoked
// RBAC is refused within the TTL as before (sooner: at the next renewal);
// an answer nobody asks for expires as before and costs no review. A failed
// renewal leaves the answer to expire; the next request then asks itself
// (and falls back on the last known answer when the apiserver is
// unreachable: lastknown.go). Requests that find no answer share one
// review, as the library's token cache has them do.
//
// Bearer tokens (TokenReview) are not renewed: kube-apiserver keeps its
// own successful token authentications for 10 s, so a renewal before our
// answer expired would mostly read the apiserver's cached answer and keep
// it another TTL — measured, a deleted ServiceAccount's token then worked
// for 16–18 s on the tier instead of 10 (cache-server/e2e/authedges
// TestServiceAccountTokens). RBAC has no such cache in the apiserver.

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
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
	// reviewTimeout bounds a review that no single request owns: a renewal,
	// or a lookup that several requests wait for (each stops waiting when
	// its own request ends).
	reviewTimeout = 10 * time.Second
)

// renewingAnswers keeps authorization answers for ttl and renews those in
// use before they expire (see above).
type renewingAnswers struct {
	ttl   time.Duration
	clock clock.Clock
	// renewals counts renewals by result: renewed, failed (may be nil).
	renewals *prometheus.CounterVec
	log      logr.Logger
	// inFlight lets tests wait for the renewals started.
	inFlight sync.WaitGroup

	answers *cache.LRUExpireCache // key → renewable
	lookups singleflight.Group

	// mu guards renewing and orders the answers' updates (keep).
	mu       sync.Mutex
	renewing map[string]struct{}
}

type renewable struct {
	v authzAnswer
	// asked is when the review was sent: the answer may describe the
	// cluster as it was then, so its age counts from there.
	asked time.Time
}

func newRenewingAnswers(ttl time.Duration, c clock.Clock, renewals *prometheus.CounterVec, log logr.Logger) *renewingAnswers {
	return &renewingAnswers{
		ttl: ttl, clock: c, renewals: renewals, log: log,
		answers:  cache.NewLRUExpireCacheWithClock(renewalMaxEntries, c),
		renewing: map[string]struct{}{},
	}
}

// get answers from the answer kept for key, renewing it when it is in the
// last quarter of the TTL, or asks (once for all requests that find none).
// An answer ask returns with an error is not kept.
func (r *renewingAnswers) get(ctx context.Context, key string, ask func(context.Context) (authzAnswer, error)) (authzAnswer, error) {
	if v, ok := r.answers.Get(key); ok {
		kept := v.(renewable)
		if r.clock.Since(kept.asked) >= r.ttl-r.ttl/4 {
			r.renew(ctx, key, ask)
		}
		return kept.v, nil
	}
	type result struct {
		v   authzAnswer
		err error
	}
	ch := r.lookups.DoChan(key, func() (any, error) {
		if v, ok := r.answers.Get(key); ok { // a lookup just ended
			return result{v: v.(renewable).v}, nil
		}
		// Shared by every request waiting: none of them owns it.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		asked := r.clock.Now()
		v, err := ask(lctx)
		if err == nil {
			r.keep(key, renewable{v, asked})
		}
		return result{v, err}, nil
	})
	select {
	case res := <-ch:
		got := res.Val.(result)
		return got.v, got.err
	case <-ctx.Done():
		var zero authzAnswer
		return zero, ctx.Err()
	}
}

// keep stores ans until ttl after it was asked for, unless a later
// review's answer is kept already: a renewal held up past the expiry
// returns after the request that asked again.
func (r *renewingAnswers) keep(key string, ans renewable) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.answers.Get(key); ok && v.(renewable).asked.After(ans.asked) {
		return
	}
	if left := r.ttl - r.clock.Since(ans.asked); left > 0 {
		r.answers.Add(key, ans, left)
	}
}

// renew asks again in the background, unless a renewal of key is already
// on its way.
func (r *renewingAnswers) renew(ctx context.Context, key string, ask func(context.Context) (authzAnswer, error)) {
	r.mu.Lock()
	if _, busy := r.renewing[key]; busy {
		r.mu.Unlock()
		return
	}
	r.renewing[key] = struct{}{}
	r.mu.Unlock()
	r.inFlight.Add(1)
	go func() {
		defer r.inFlight.Done()
		defer func() {
			r.mu.Lock()
			delete(r.renewing, key)
			r.mu.Unlock()
		}()
		// The request may end first; the renewal is the cache's.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		asked := r.clock.Now()
		v, err := ask(rctx)
		if err != nil {
			r.count("failed")
			r.log.V(2).Info("renewing an authorization answer failed; it expires unrenewed", "error", err.Error())
			return
		}
		r.count("renewed")
		r.keep(key, renewable{v, asked})
	}()
}

func (r *renewingAnswers) count(result string) {
	if r.renewals != nil {
		r.renewals.WithLabelValues(result).Inc()
	}
}

// renewingAuthorizer keeps inner's answers and renews those in use. inner
// must not cache: a renewal must reach the apiserver.
type renewingAuthorizer struct {
	inner   authorizer.Authorizer
	answers *renewingAnswers
}

func (a *renewingAuthorizer) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	if !keepable(attrs) {
		return a.inner.Authorize(ctx, attrs)
	}
	ans, err := a.answers.get(ctx, attributesKey(attrs), func(ctx context.Context) (authzAnswer, error) {
		d, reason, err := a.inner.Authorize(ctx, attrs)
		return authzAnswer{d, reason}, err
	})
	return ans.decision, ans.reason, err
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

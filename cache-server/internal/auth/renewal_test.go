package auth

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	clocktesting "k8s.io/utils/clock/testing"
)

// reviewer stands for the apiserver's SubjectAccessReviews: it answers
// with its current decision and, while gate is set, holds each review until
// the gate is closed.
type reviewer struct {
	authorizer.Authorizer // only Authorize is called
	mu                    sync.Mutex
	decision              authorizer.Decision
	err                   error
	asked                 int
	gate                  chan struct{}
}

func (r *reviewer) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	r.mu.Lock()
	r.asked++
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.decision, "reviewed", r.err
}

func (r *reviewer) set(d authorizer.Decision, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decision, r.err = d, err
}

func (r *reviewer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked
}

func TestRenewingAuthorizer(t *testing.T) {
	const ttl = 10 * time.Second
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	apiserver := &reviewer{decision: authorizer.DecisionAllow}
	renewals := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"result"})
	a := &renewingAuthorizer{inner: apiserver, answers: newRenewingAnswers(ttl, clk, renewals, logr.Discard())}
	node := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes"}}, Verb: "list", Resource: "pods", ResourceRequest: true}
	ctx := context.Background()
	authorize := func(when string, want authorizer.Decision) {
		t.Helper()
		d, _, err := a.Authorize(ctx, node)
		if d != want || err != nil {
			t.Fatalf("%s: %v %v, want %v", when, d, err, want)
		}
	}

	authorize("first request", authorizer.DecisionAllow)
	clk.Step(7 * time.Second)
	authorize("within three quarters of the TTL", authorizer.DecisionAllow)
	a.answers.inFlight.Wait()
	if n := apiserver.count(); n != 1 {
		t.Fatalf("asked %d times within three quarters of the TTL, want 1", n)
	}

	// In the last quarter: answered at once, renewed in the background —
	// once however many requests find it there. RBAC was revoked
	// meanwhile: the renewal brings the refusal.
	apiserver.set(authorizer.DecisionNoOpinion, nil)
	apiserver.mu.Lock()
	apiserver.gate = make(chan struct{})
	apiserver.mu.Unlock()
	clk.Step(1 * time.Second) // 8 s old
	for range 5 {
		authorize("in the last quarter, renewal on its way", authorizer.DecisionAllow)
	}
	close(apiserver.gate)
	a.answers.inFlight.Wait()
	if n := apiserver.count(); n != 2 {
		t.Fatalf("asked %d times, want 2: one renewal for five requests", n)
	}
	authorize("after the renewal", authorizer.DecisionNoOpinion)
	if got := testutil.ToFloat64(renewals.WithLabelValues("renewed")); got != 1 {
		t.Errorf("renewed %v, want 1", got)
	}

	// The renewed answer counts from its review: unrenewed, it expires a
	// TTL later and the request then asks itself.
	apiserver.mu.Lock()
	apiserver.gate = nil
	apiserver.mu.Unlock()
	apiserver.set(authorizer.DecisionAllow, nil)
	clk.Step(ttl + time.Millisecond)
	authorize("a TTL after the renewal", authorizer.DecisionAllow)
	if n := apiserver.count(); n != 3 {
		t.Fatalf("asked %d times, want 3: an expired answer is asked for again", n)
	}

	// A renewal still on its way when the answer expires: the answer is
	// not used past the TTL; the request asks itself.
	apiserver.mu.Lock()
	gate := make(chan struct{})
	apiserver.gate = gate
	apiserver.mu.Unlock()
	clk.Step(8 * time.Second)
	go a.Authorize(ctx, node) // starts the renewal, which waits at the gate
	waitFor(t, func() bool { return apiserver.count() == 4 })
	clk.Step(3 * time.Second)
	apiserver.set(authorizer.DecisionDeny, nil)
	apiserver.mu.Lock()
	apiserver.gate = nil
	apiserver.mu.Unlock()
	authorize("past the TTL with a renewal held up", authorizer.DecisionDeny)
	// The held-up renewal was sent before the request's review: its
	// answer (allow) does not replace the later one.
	apiserver.set(authorizer.DecisionAllow, nil)
	close(gate)
	a.answers.inFlight.Wait()
	authorize("after the held-up renewal returned", authorizer.DecisionDeny)

	// A failed renewal leaves the answer to expire; the request after it
	// gets the apiserver's error (lastknown.go answers that one).
	clk.Step(ttl + time.Millisecond)
	apiserver.set(authorizer.DecisionAllow, nil)
	authorize("fresh", authorizer.DecisionAllow)
	apiserver.set(authorizer.DecisionNoOpinion, refused())
	clk.Step(8 * time.Second)
	authorize("renewal fails", authorizer.DecisionAllow)
	a.answers.inFlight.Wait()
	if got := testutil.ToFloat64(renewals.WithLabelValues("failed")); got != 1 {
		t.Errorf("failed %v, want 1", got)
	}
	authorize("after a failed renewal, within the TTL", authorizer.DecisionAllow)
	a.answers.inFlight.Wait()
	clk.Step(2*time.Second + time.Millisecond)
	if _, _, err := a.Authorize(ctx, node); err == nil {
		t.Fatal("an answer whose renewal failed was used past the TTL")
	}

	// Other attributes are other answers.
	apiserver.set(authorizer.DecisionAllow, nil)
	asked := apiserver.count()
	watch := node
	watch.Verb = "watch"
	authorize("another verb", authorizer.DecisionAllow)
	a.Authorize(ctx, watch)
	if n := apiserver.count() - asked; n != 2 {
		t.Errorf("asked %d times for two questions, want 2", n)
	}
}

func TestRenewingAuthorizerSkipsHugeAttributes(t *testing.T) {
	apiserver := &reviewer{decision: authorizer.DecisionAllow}
	a := &renewingAuthorizer{inner: apiserver, answers: newRenewingAnswers(10*time.Second, clocktesting.NewFakeClock(time.Unix(1000, 0)), nil, logr.Discard())}
	huge := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "alice"}, Verb: "get", Resource: "configmaps", Name: strings.Repeat("x", renewalMaxAttributes), ResourceRequest: true}
	for range 2 {
		if _, _, err := a.Authorize(context.Background(), huge); err != nil {
			t.Fatal(err)
		}
	}
	if n := apiserver.count(); n != 2 {
		t.Errorf("asked %d times, want 2: attributes this long are not kept", n)
	}
	apiserver.set(authorizer.DecisionDeny, errors.New("boom"))
	if _, _, err := a.Authorize(context.Background(), huge); err == nil {
		t.Error("the error was lost")
	}
}

// TestLookupsShared: requests that find no answer wait for one review, and
// one whose request ends stops waiting without ending the others'.
func TestLookupsShared(t *testing.T) {
	apiserver := &reviewer{decision: authorizer.DecisionAllow, gate: make(chan struct{})}
	a := &renewingAuthorizer{inner: apiserver, answers: newRenewingAnswers(10*time.Second, clocktesting.NewFakeClock(time.Unix(1000, 0)), nil, logr.Discard())}
	alice := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "alice"}, Verb: "list", Resource: "pods", ResourceRequest: true}
	gone, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, _, err := a.Authorize(gone, alice)
		left <- err
	}()
	waitFor(t, func() bool { return apiserver.count() == 1 })
	var wg sync.WaitGroup
	decisions := make([]authorizer.Decision, 8)
	for i := range decisions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			decisions[i], _, _ = a.Authorize(context.Background(), alice)
		}()
	}
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the request that ended: %v, want context.Canceled", err)
	}
	time.Sleep(10 * time.Millisecond) // the others are waiting
	close(apiserver.gate)
	wg.Wait()
	for i, d := range decisions {
		if d != authorizer.DecisionAllow {
			t.Errorf("request %d: %v, want allow", i, d)
		}
	}
	if n := apiserver.count(); n != 1 {
		t.Errorf("asked %d times for 9 requests of one question, want 1", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

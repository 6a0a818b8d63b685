package auth

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	clocktesting "k8s.io/utils/clock/testing"
)

// scriptedAuthorizer answers with whatever the test set last.
type scriptedAuthorizer struct {
	authorizer.Authorizer
	decision authorizer.Decision
	err      error
	asked    int
}

func (s *scriptedAuthorizer) Authorize(context.Context, authorizer.Attributes) (authorizer.Decision, string, error) {
	s.asked++
	return s.decision, "scripted", s.err
}

func TestLastKnownAuthorizer(t *testing.T) {
	used := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"review", "result"})
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	inner := &scriptedAuthorizer{decision: authorizer.DecisionAllow}
	kept := newLastKnown[authzAnswer]("subjectaccessreview", used, logr.Discard())
	kept.clock = clk
	a := &lastKnownAuthorizer{inner: inner, answers: kept}
	alice := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "alice"}, Verb: "list", Resource: "pods", ResourceRequest: true}
	bob := alice
	bob.User = &user.DefaultInfo{Name: "bob"}
	watchAlice := alice
	watchAlice.Verb = "watch"
	ctx := context.Background()

	if d, _, err := a.Authorize(ctx, alice); d != authorizer.DecisionAllow || err != nil {
		t.Fatalf("apiserver up: %v %v", d, err)
	}
	inner.decision = authorizer.DecisionNoOpinion
	if d, _, _ := a.Authorize(ctx, bob); d != authorizer.DecisionNoOpinion {
		t.Fatalf("bob: %v", d)
	}

	// The apiserver is unreachable: the same questions get the last answers,
	// other questions the error.
	inner.decision, inner.err = authorizer.DecisionNoOpinion, refused()
	clk.SetTime(clk.Now().Add(time.Minute))
	if d, _, err := a.Authorize(ctx, alice); d != authorizer.DecisionAllow || err != nil {
		t.Fatalf("alice, apiserver down: %v %v, want the last answer (allow)", d, err)
	}
	if d, _, err := a.Authorize(ctx, bob); d != authorizer.DecisionNoOpinion || err != nil {
		t.Fatalf("bob, apiserver down: %v %v, want the last answer (no opinion, no error)", d, err)
	}
	if _, _, err := a.Authorize(ctx, watchAlice); err == nil {
		t.Fatal("a question never answered got no error with the apiserver down")
	}
	// Within lastKnownRetry of the failure the apiserver is not asked again.
	asked := inner.asked
	a.Authorize(ctx, alice)
	if inner.asked != asked {
		t.Errorf("asked the apiserver %d more times within %s of a failure", inner.asked-asked, lastKnownRetry)
	}
	if got := testutil.ToFloat64(used.WithLabelValues("subjectaccessreview", "reused")); got != 3 {
		t.Errorf("reused %v, want 3", got)
	}
	if got := testutil.ToFloat64(used.WithLabelValues("subjectaccessreview", "none")); got != 1 {
		t.Errorf("none %v, want 1", got)
	}

	// An answer from the apiserver, even a refusal (4xx), is never replaced.
	clk.SetTime(clk.Now().Add(lastKnownRetry + time.Second))
	inner.err = apierrors.NewForbidden(schema.GroupResource{Group: "authorization.k8s.io", Resource: "subjectaccessreviews"}, "", errors.New("no"))
	if _, _, err := a.Authorize(ctx, alice); err == nil {
		t.Fatal("a 403 from the apiserver was replaced by the last answer")
	}
	// Too old answers are not reused.
	inner.err = apierrors.NewServiceUnavailable("down")
	clk.SetTime(clk.Now().Add(lastKnownMaxAge))
	if _, _, err := a.Authorize(ctx, alice); err == nil {
		t.Fatalf("an answer older than %s was reused", lastKnownMaxAge)
	}
}

// scriptedAuthenticator authenticates every request as alice, or fails.
type scriptedAuthenticator struct{ err error }

func (s *scriptedAuthenticator) AuthenticateRequest(*http.Request) (*authenticator.Response, bool, error) {
	if s.err != nil {
		return nil, false, s.err
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: "alice"}}, true, nil
}

func TestLastKnownTokens(t *testing.T) {
	inner := &scriptedAuthenticator{}
	a := &lastKnownTokens{inner: inner, answers: newLastKnown[*authenticator.Response]("tokenreview", nil, logr.Discard())}
	req := func(token string) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, "https://tier/api", nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		return r
	}
	if _, ok, err := a.AuthenticateRequest(req("t1")); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// The union of authenticators aggregates its parts' errors.
	inner.err = utilerrors.NewAggregate([]error{refused()})
	if resp, ok, err := a.AuthenticateRequest(req("t1")); !ok || err != nil || resp.User.GetName() != "alice" {
		t.Fatalf("known token, apiserver down: %v %v", ok, err)
	}
	if _, ok, _ := a.AuthenticateRequest(req("t2")); ok {
		t.Fatal("an unknown token authenticated with the apiserver down")
	}
	if _, ok, _ := a.AuthenticateRequest(req("")); ok {
		t.Fatal("a request without a token authenticated by the kept answers")
	}
	// The apiserver answers again: a TokenReview refusing the token (its
	// ServiceAccount deleted) comes back as status.error — an answer, not
	// an outage; the kept success must not outlive it.
	a.answers.down = time.Time{}
	inner.err = utilerrors.NewAggregate([]error{errors.New(`service account "default/app" has been deleted`)})
	if _, ok, _ := a.AuthenticateRequest(req("t1")); ok {
		t.Fatal("a token the apiserver refused was authenticated by the kept answer")
	}
}

func refused() error {
	return &url.Error{Op: "Post", URL: "https://apiserver/apis/authorization.k8s.io/v1/subjectaccessreviews", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
}

func TestUnavailable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{refused(), true},
		{apierrors.NewServiceUnavailable("x"), true},
		{apierrors.NewTooManyRequests("x", 1), true},
		{apierrors.NewInternalError(errors.New("x")), true},
		{utilerrors.NewAggregate([]error{errors.New("invalid bearer token"), refused()}), true},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "subjectaccessreviews"}, "", errors.New("x")), false},
		{apierrors.NewUnauthorized("x"), false},
		{errors.New("token has been invalidated"), false},
		{utilerrors.NewAggregate([]error{errors.New("token has been invalidated")}), false},
	} {
		if got := unavailable(c.err); got != c.want {
			t.Errorf("unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestAttributesKeyStable: the same question gives the same key, however
// the user's extra attributes are iterated (a map), and another selector
// another key.
func TestAttributesKeyStable(t *testing.T) {
	extra := map[string][]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		extra["example.com/"+k] = []string{k}
	}
	a := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "alice", Extra: extra}, Verb: "list", Resource: "pods", ResourceRequest: true}
	want := attributesKey(a)
	for range 50 {
		if got := attributesKey(a); got != want {
			t.Fatalf("key changed between two calls:\n%q\n%q", got, want)
		}
	}
	b := a
	b.FieldSelectorRequirements = fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "n1"}}
	if attributesKey(b) == want {
		t.Error("a field selector does not change the key")
	}
}

package auth

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// testAuthorizer: alice may impersonate user bob (legacy verb only) and do
// anything else; bob may list pods; nobody else may do anything. Pure
// policy, standing in for the apiserver's RBAC behind SubjectAccessReview.
func testAuthorizer() authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		switch name := a.GetUser().GetName(); {
		case a.GetVerb() == "impersonate":
			if name == "alice" && a.GetResource() == "users" && a.GetName() == "bob" {
				return authorizer.DecisionAllow, "", nil
			}
		case strings.HasPrefix(a.GetVerb(), "impersonate"):
			// constrained impersonation verbs: nobody
		case name == "alice":
			return authorizer.DecisionAllow, "", nil
		case name == "bob" && a.GetVerb() == "list" && a.GetResource() == "pods":
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	})
}

// TestImpersonationWithConnCache drives the real chain (request info,
// authentication through the per-connection cache, the apiserver's
// impersonation filter, authorization) with requests on one connection: the
// cached identity of the caller is reused, but every request is answered as
// the identity its own impersonation headers ask for — never as one an
// earlier request on the connection impersonated, and never as the caller
// when the impersonation is refused.
func TestImpersonationWithConnCache(t *testing.T) {
	inner := &fakeInner{}
	cached, _ := newTestAuthenticator(inner)
	var logs bytes.Buffer
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t"}, []string{"result"})
	opts := Options{
		ImpersonationResults: results,
		Log:                  funcr.New(func(prefix, args string) { logs.WriteString(args + "\n") }, funcr.Options{}),
	}
	var served []string
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := request.UserFrom(r.Context())
		served = append(served, u.GetName())
		for name := range r.Header {
			if strings.HasPrefix(name, "Impersonate-") {
				t.Errorf("header %s reached the handler", name)
			}
		}
		// Watches flush: the handler must get the server's writer, not
		// the recorder that watches the filter's refusals.
		if _, ok := w.(*impersonationRecorder); ok {
			t.Errorf("the handler got the impersonation recorder")
		}
		if _, ok := w.(http.Flusher); !ok {
			t.Errorf("the handler's writer cannot flush")
		}
		_, _ = w.Write([]byte("ok"))
	})
	resolver := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	h := chain(handler, cached, testAuthorizer(), testRequestHeader(), resolver, opts)
	conn := newTestConn(true, stubLeaf(testStart.Add(365*24*3600e9)))

	cases := []struct {
		headers  []string
		wantCode int
		wantUser string // who the handler saw; "" when refused
		wantMsg  string // in the Status message when refused
	}{
		{headers: nil, wantCode: 200, wantUser: "alice"},
		{headers: []string{"Impersonate-User", "bob"}, wantCode: 200, wantUser: "bob"},
		{headers: nil, wantCode: 200, wantUser: "alice"},
		{headers: []string{"Impersonate-User", "mallory"}, wantCode: 403,
			wantMsg: `users "mallory" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope`},
		{headers: []string{"Impersonate-User", "bob", "Impersonate-Group", "admins"}, wantCode: 403,
			wantMsg: `groups "admins" is forbidden: User "alice" cannot impersonate resource "groups" in API group "" at the cluster scope`},
		{headers: []string{"Impersonate-Group", "admins"}, wantCode: 400, wantMsg: "without impersonating a user name"},
		{headers: []string{"Impersonate-User", "bob"}, wantCode: 200, wantUser: "bob"},
		{headers: nil, wantCode: 200, wantUser: "alice"},
	}
	for i, c := range cases {
		served = nil
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, conn.request(append([]string{"Authorization", "Bearer good-alice"}, c.headers...)...))
		if rec.Code != c.wantCode {
			t.Fatalf("request %d %v: code %d, want %d: %s", i, c.headers, rec.Code, c.wantCode, rec.Body)
		}
		if c.wantUser != "" {
			if len(served) != 1 || served[0] != c.wantUser {
				t.Fatalf("request %d %v: served as %v, want %s", i, c.headers, served, c.wantUser)
			}
			continue
		}
		if len(served) != 0 {
			t.Fatalf("request %d %v: refused request reached the handler as %v", i, c.headers, served)
		}
		var st metav1.Status
		if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || !strings.Contains(st.Message, c.wantMsg) || st.Code != int32(c.wantCode) {
			t.Fatalf("request %d %v: status %+v (%v), want message containing %q", i, c.headers, st, err, c.wantMsg)
		}
	}
	// One authentication for the whole connection: the cache answered the
	// rest, and impersonation was decided per request on top of it.
	wantCalls(t, inner, 1)
	for result, want := range map[string]float64{"allowed": 2, "forbidden": 2, "invalid": 1} {
		if got := testutil.ToFloat64(results.WithLabelValues(result)); got != want {
			t.Errorf("%s: %v, want %v", result, got, want)
		}
	}
	for _, want := range []string{`"impersonateUser"="mallory"`, `"caller"="alice"`, `"code"=403`, `"impersonateGroups"=["admins"]`, `"code"=400`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}
}

// A refused impersonation on a connection that never authenticated before
// must not leave the impersonated identity (or anything) in the cache for
// the next request.
func TestImpersonationRefusedFirstOnConnection(t *testing.T) {
	inner := &fakeInner{}
	cached, _ := newTestAuthenticator(inner)
	var served []string
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, _ := request.UserFrom(r.Context())
		served = append(served, u.GetName())
	})
	resolver := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	h := chain(handler, cached, testAuthorizer(), testRequestHeader(), resolver, Options{})
	conn := newTestConn(true, stubLeaf(testStart.Add(365*24*3600e9)))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, conn.request("X-Remote-User", "carol", "Impersonate-User", "bob"))
	if rec.Code != http.StatusForbidden || len(served) != 0 {
		t.Fatalf("carol impersonating bob: %d, served %v", rec.Code, served)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, conn.request("X-Remote-User", "carol"))
	if rec.Code != http.StatusForbidden || len(served) != 0 {
		t.Fatalf("carol herself may do nothing: %d, served %v", rec.Code, served)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, conn.request("X-Remote-User", "bob"))
	if rec.Code != http.StatusOK || len(served) != 1 || served[0] != "bob" {
		t.Fatalf("bob: %d, served %v", rec.Code, served)
	}
}

// The chain records when a request was received, before it is
// authenticated or queued: a consistent read may use an RV fetch that
// started after that moment (package coalesce).
func TestChainRecordsReceipt(t *testing.T) {
	inner := &fakeInner{}
	cached, _ := newTestAuthenticator(inner)
	var received time.Time
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received, _ = request.ReceivedTimestampFrom(r.Context())
	})
	resolver := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	h := chain(handler, cached, testAuthorizer(), testRequestHeader(), resolver, Options{})
	conn := newTestConn(true, stubLeaf(testStart.Add(365*24*3600e9)))
	before := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, conn.request("X-Remote-User", "bob"))
	if rec.Code != http.StatusOK || received.Before(before) || received.After(time.Now()) {
		t.Fatalf("%d, received %v (the request was sent at %v)", rec.Code, received, before)
	}
}

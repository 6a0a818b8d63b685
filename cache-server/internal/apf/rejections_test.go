package apf

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/cache-server/internal/front"
)

// TestRejectLog: a flood of 429s logs one line per user and priority
// level per interval, with the count in between; other users and levels
// get their own lines; the map forgets users logged more than an
// interval ago.
func TestRejectLog(t *testing.T) {
	var lines []string
	l := newRejectLog(logr.Logger(funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})))
	now := time.Date(2026, 11, 26, 2, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return now }
	reject := func(name, pl string) {
		r := httptest.NewRequest("GET", "/api/v1/configmaps", nil)
		ctx := request.WithUser(request.WithRequestInfo(r.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: "list", Resource: "configmaps"}),
			&user.DefaultInfo{Name: name, Groups: []string{user.AllAuthenticated}})
		l.rejected(r.WithContext(ctx), "global-default", pl)
	}
	for range 100 {
		reject("flooder", "global-default")
		now = now.Add(100 * time.Millisecond)
	}
	reject("other", "global-default")
	reject("flooder", "workload-low")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3: %q", len(lines), lines)
	}
	for _, want := range []string{`"user"="flooder"`, `"priorityLevel"="global-default"`, `"flowSchema"="global-default"`, `"verb"="list"`, `"resource"="configmaps"`, `"rejectedSinceLastLine"=0`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("first line %s: no %s", lines[0], want)
		}
	}
	now = now.Add(rejectLogInterval)
	reject("flooder", "global-default")
	if len(lines) != 4 || !strings.Contains(lines[3], `"rejectedSinceLastLine"=99`) {
		t.Fatalf("after an interval: %q", lines[3:])
	}
	// "other" and flooder at workload-low were logged more than an
	// interval ago: forgotten.
	if len(l.entries) != 1 {
		t.Errorf("%d users remembered, want 1: %v", len(l.entries), l.entries)
	}
}

type wide struct{}

// Cost: 25 seats (25,000 objects walked), more than a level of 20.
func (wide) Cost(*http.Request, *request.RequestInfo) front.Cost {
	return front.Cost{Kind: front.CostList, Walked: 25_000}
}

// TestFilterLogsRejections: through the filter, a request that executes
// logs nothing; one the level rejects is logged with its user and level.
func TestFilterLogsRejections(t *testing.T) {
	client := fake.NewClientset(&flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "catch-all"}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
		Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
			NominalConcurrencyShares: ptr.To[int32](5), LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}})
	var mu sync.Mutex
	var lines []string
	log := logr.Logger(funcr.New(func(_, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := New(Options{Client: client, ServerConcurrencyLimit: 20, Costs: wide{}, Log: log})
	a.Start(ctx)
	release, running := make(chan struct{}), make(chan struct{}, 1)
	h := a.Filter(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		running <- struct{}{}
		<-release
	}))
	serve := func() int {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/configmaps", nil)
		ctx := request.WithUser(request.WithRequestInfo(r.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: "list", APIVersion: "v1", Resource: "configmaps"}),
			&user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r.WithContext(ctx))
		return rec.Code
	}
	done := make(chan int, 1)
	go func() { done <- serve() }()
	<-running // the first executes, alone: wider than its level
	if code := serve(); code != http.StatusTooManyRequests {
		t.Fatalf("the second request: %d, want 429", code)
	}
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the first request: %d", code)
	}
	mu.Lock()
	defer mu.Unlock()
	var rejections []string
	for _, l := range lines {
		if strings.Contains(l, "rejected by priority and fairness") {
			rejections = append(rejections, l)
		}
	}
	if len(rejections) != 1 || !strings.Contains(rejections[0], `"user"="alice"`) || !strings.Contains(rejections[0], `"priorityLevel"="catch-all"`) {
		t.Errorf("rejection log lines: %q", rejections)
	}
}

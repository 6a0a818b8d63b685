package apf

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
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

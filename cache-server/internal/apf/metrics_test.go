package apf

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/go-logr/logr"

	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/internal/metriclint"
)

// boundedLabels: a cluster's priority levels and flow schemas are a
// handful of objects admins create (the defaults: a dozen), the rest
// fixed sets of the library's.
var boundedLabels = []string{"priority_level", "flow_schema", "reason", "execute", "type"}

type oneSeat struct{}

func (oneSeat) Cost(*http.Request, *request.RequestInfo) front.Cost {
	return front.Cost{Kind: front.CostGet}
}

// TestGathererServesTheExportedFamilies: after requests went through the
// filter, the served families are exactly the exported ones that have
// series, and they pass the project's metric lint. The configuration
// comes from a fake clientset here (a unit test of the metric plumbing);
// the e2e flood test runs the same against a real apiserver.
func TestGathererServesTheExportedFamilies(t *testing.T) {
	client := fake.NewClientset(
		&flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "catch-all"}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](5), LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject}}}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := New(Options{Client: client, ServerConcurrencyLimit: 20, Costs: oneSeat{}, Log: logr.Discard()})
	a.Start(ctx)
	served := 0
	h := a.Filter(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served++ }))
	deadline := time.Now().Add(30 * time.Second)
	for served < 5 && time.Now().Before(deadline) {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil)
		ctx := request.WithUser(request.WithRequestInfo(r.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: "list", APIVersion: "v1", Resource: "pods"}),
			&user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}})
		h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx))
	}
	if served < 5 {
		t.Fatalf("%d requests served", served)
	}
	mfs, err := Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		labels, ok := metrics.FlowControl[mf.GetName()]
		if !ok {
			t.Errorf("%s is served but not listed in metrics.FlowControl", mf.GetName())
			continue
		}
		// The labels the dashboard test checks panels against are the
		// library's.
		for _, m := range mf.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName())
			}
			if !sameSet(got, labels) {
				t.Errorf("%s has labels %v, metrics.FlowControl says %v", mf.GetName(), got, labels)
				break
			}
		}
	}
	for _, want := range []string{"apiserver_flowcontrol_dispatched_requests_total", "apiserver_flowcontrol_nominal_limit_seats", "apiserver_flowcontrol_work_estimated_seats"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not served (served: %v)", want, names)
		}
	}
	problems, err := metriclint.Problems(Gatherer(), boundedLabels)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

package front_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/cache-server/internal/apf"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
)

// The priority-and-fairness work estimate of the requests real clients
// send, from what a real front (a store ingested from a loopback
// apiserver, with the node index) says they walk and hold. These tests
// live here, not in package apf, to reach front's test server.

var infos = &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}

func requestOf(t *testing.T, target, accept string) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, target, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	info, err := infos.NewRequestInfo(r)
	if err != nil {
		t.Fatal(err)
	}
	ctx := request.WithUser(request.WithRequestInfo(r.Context(), info), &user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}})
	return r.WithContext(ctx)
}

// TestSeatsOfRequestShapes: a kubelet's LIST and watch of its node's
// pods (read through the node index), GETs and plain watches take one
// seat whatever the resource's size; a namespace's LIST is charged for
// its namespace, not the resource; a full LIST and a full watch-list are
// charged by the resource's count and bytes (as kube-apiserver charges
// every cache-served LIST); a page by the page; a Table for what it
// holds while built.
func TestSeatsOfRequestShapes(t *testing.T) {
	const n, namespaces, nodes = 20_000, 20, 200
	srv, stop := front.NewPodsServer(t, n, namespaces, nodes)
	defer stop()
	estimate := apf.Estimator(srv, defaultSeatCPU, apf.SeatsPerCore)
	seats := func(target, accept string) uint64 {
		t.Helper()
		return estimate(requestOf(t, target, accept), "global-default", "global-default").InitialSeats
	}
	const table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
	full := seats("/api/v1/pods", "")
	// 20,000 objects walked: 20 seats for the walk alone, plus the bytes.
	if full < n/1000 {
		t.Errorf("a full LIST of %d pods: %d seats, want at least %d", n, full, n/1000)
	}
	for _, tc := range []struct {
		name, target, accept string
		want                 uint64
	}{
		{"kubelet: its node's pods", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7&resourceVersion=0", "", 1},
		{"kubelet: its node's pods, consistent", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7", "", 1},
		{"kubelet: watch of its node's pods", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7&resourceVersion=1500&watch=true&allowWatchBookmarks=true", "", 1},
		{"kubelet: watch-list of its node's pods", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-7&watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", "", 1},
		// 1,000 pods of ~370 B: a seat for the walk, one for the bytes.
		{"a namespace's pods", "/api/v1/namespaces/ns-3/pods", "", 2},
		{"GET", "/api/v1/namespaces/ns-3/pods/pod-000003", "", 1},
		{"plain watch of every pod", "/api/v1/pods?watch=true&resourceVersion=1500", "", 1},
		{"a first page of 500", "/api/v1/pods?limit=500", "", 1},
		{"informer: watch-list of every pod", "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", "", full},
		{"informer: legacy watch from RV 0", "/api/v1/pods?watch=true&resourceVersion=0", "", full},
	} {
		if got := seats(tc.target, tc.accept); got != tc.want {
			t.Errorf("%s (%s): %d seats, want %d", tc.name, tc.target, got, tc.want)
		}
	}
	// A label selector walks the whole resource however few it returns.
	if got := seats("/api/v1/pods?labelSelector=app%3Da1", ""); got < n/1000 {
		t.Errorf("a full LIST by label: %d seats, want at least %d", got, n/1000)
	}
	// kubectl get in a namespace: its Table is built whole in memory.
	if json, tbl := seats("/api/v1/namespaces/ns-3/pods", ""), seats("/api/v1/namespaces/ns-3/pods", table); tbl <= json {
		t.Errorf("a namespace's Table: %d seats, its JSON LIST %d; want more", tbl, json)
	}
	t.Logf("a full LIST of %d pods: %d seats", n, full)
}

// gatedWriter holds the response's writes until open is closed: a client
// that has not read yet.
type gatedWriter struct {
	http.ResponseWriter
	open <-chan struct{}
}

func (g gatedWriter) Write(b []byte) (int, error) {
	<-g.open
	return g.ResponseWriter.Write(b)
}

func (g gatedWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// TestWatchListHoldsSeatsUntilInitialEventsEnd: through the priority and
// fairness filter, a watch-list of every pod executes with its LIST's
// seats while its initial events are written, and releases them at its
// initial-events-end bookmark although the watch stays open.
func TestWatchListHoldsSeatsUntilInitialEventsEnd(t *testing.T) {
	const n = 5000
	srv, stop := front.NewPodsServer(t, n, 4, 50)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// No configuration objects: the mandatory catch-all level takes
	// every request (and every seat but the exempt level's).
	learner := seatcpu.New(nil, logr.Discard())
	fairness := apf.New(apf.Options{Client: fake.NewClientset(), ServerConcurrencyLimit: 100, Costs: srv, Learner: learner, Log: logr.Discard()})
	fairness.Start(ctx)
	open := make(chan struct{})
	h := fairness.Filter(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(gatedWriter{w, open}, r)
	}))
	hs := authenticated(t, h)
	defer hs.Close()

	const watchList = "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	want := apf.Estimator(srv, defaultSeatCPU, apf.SeatsPerCore)(requestOf(t, watchList, ""), "", "").InitialSeats
	if want < 5 {
		t.Fatalf("a watch-list of %d pods estimated at %d seats", n, want)
	}
	const executing = "apiserver_flowcontrol_current_executing_seats"
	waitFor := func(what string, ok func(float64) bool) {
		t.Helper()
		waitForLevelGauge(t, executing, "catch-all", what, ok)
	}

	respc := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+watchList, nil)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Error(err)
			close(respc)
			return
		}
		respc <- resp
	}()
	// Writing its initial events, the watch-list holds its estimate.
	waitFor("while its initial events are written", func(v float64) bool { return v == float64(want) })
	time.Sleep(200 * time.Millisecond)
	if v := levelGauge(t, executing, "catch-all"); v != float64(want) {
		t.Fatalf("catch-all executes %g seats before the bookmark, want %d", v, want)
	}
	close(open)
	resp := <-respc
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	events := 0
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"k8s.io/initial-events-end":"true"`) {
			break
		}
		events++
	}
	if events != n {
		t.Fatalf("%d initial events, want %d (%v)", events, n, sc.Err())
	}
	// After the bookmark: the seats are free, the watch still open; its
	// work was counted when it began, where its CPU was spent.
	waitFor("after the initial-events-end bookmark", func(v float64) bool { return v == 0 })
	r := requestOf(t, watchList, "")
	info, _ := request.RequestInfoFrom(r.Context())
	if c := srv.Cost(r, info); learner.Work(seatcpu.WatchList) < seatcpu.Work(c.Walked, c.Bytes)-0.01 {
		t.Errorf("the open watch-list's work counted: %g seats' worth, want %g", learner.Work(seatcpu.WatchList), seatcpu.Work(c.Walked, c.Bytes))
	}
	if got := apf.Estimator(srv, defaultSeatCPU, apf.SeatsPerCore)(requestOf(t, "/api/v1/pods?watch=true&resourceVersion=1500", ""), "", "").InitialSeats; got != 1 {
		t.Errorf("a plain watch: %d seats, want 1", got)
	}
}

// authenticated serves h to requests of alice (what the chain's
// authentication would have put in their context).
func authenticated(t *testing.T, h http.Handler) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, err := infos.NewRequestInfo(r)
		if err != nil {
			t.Error(err)
			return
		}
		ctx := request.WithUser(request.WithRequestInfo(r.Context(), info), &user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}})
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
}

// defaultSeatCPU is the estimators' CPU per seat's worth of work before
// a process has learned its own.
func defaultSeatCPU(seatcpu.Kind) time.Duration { return seatcpu.Default }

// TestListSeatsLingerForTheCoreTheyTook: through the priority and
// fairness filter, a full LIST's seats stay in use after its response is
// complete (its client does not wait for them) for apf.Linger, and the
// next LIST of the level, which the level cannot hold beside them, waits
// for them: back to back, a level's LISTs run at its seats' share of a
// core.
func TestListSeatsLingerForTheCoreTheyTook(t *testing.T) {
	const n = 5000
	srv, stop := front.NewPodsServer(t, n, 4, 50)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A slow core, so that the linger is long enough to see.
	const seatCPU = 20 * time.Millisecond
	const list = "/api/v1/pods"
	we := apf.Estimator(srv, func(seatcpu.Kind) time.Duration { return seatCPU }, apf.SeatsPerCore)(requestOf(t, list, ""), "", "")
	if we.AdditionalLatency < 200*time.Millisecond || we.FinalSeats != we.InitialSeats {
		t.Fatalf("a full LIST of %d pods: %+v, want its seats lingering 200 ms or more", n, we)
	}
	// A level that queues (the mandatory catch-all rejects instead),
	// neither lending nor borrowing, with room for one such LIST, not
	// two: 100 of the 105 shares (the catch-all has 5).
	const level = "lingering"
	client := fake.NewClientset(
		&flowcontrolv1.PriorityLevelConfiguration{ObjectMeta: metav1.ObjectMeta{Name: level}, Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited, Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](100), LendablePercent: ptr.To[int32](0),
				LimitResponse: flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeQueue,
					Queuing: &flowcontrolv1.QueuingConfiguration{Queues: 1, HandSize: 1, QueueLengthLimit: 10}}}}},
		&flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: level}, Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: level}, MatchingPrecedence: 100,
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects:      []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindGroup, Group: &flowcontrolv1.GroupSubject{Name: user.AllAuthenticated}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}, ClusterScope: true, Namespaces: []string{"*"}}}}}}})
	limit := int(we.InitialSeats) * 3 / 2
	lingering := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lingering_seat_seconds_total"}, []string{"priority_level"})
	// The learner (not run: SeatCPU fixes the estimate) counts the work.
	learner := seatcpu.New(nil, logr.Discard())
	fairness := apf.New(apf.Options{Client: client, ServerConcurrencyLimit: limit, Costs: srv, Learner: learner, SeatCPU: seatCPU, Lingering: lingering, Log: logr.Discard()})
	fairness.Start(ctx)
	hs := authenticated(t, fairness.Filter(srv))
	defer hs.Close()
	gauge := func(name string) float64 {
		t.Helper()
		return levelGauge(t, name, level)
	}
	waitForLevelGauge(t, "apiserver_flowcontrol_nominal_limit_seats", level, "the level's configuration", func(v float64) bool { return v > 0 })
	if c := gauge("apiserver_flowcontrol_nominal_limit_seats"); c < float64(we.InitialSeats) || c >= 2*float64(we.InitialSeats) {
		t.Fatalf("the level has %g seats; want room for one LIST of %d, not two", c, we.InitialSeats)
	}
	get := func() time.Duration {
		t.Helper()
		start := time.Now()
		resp, err := hs.Client().Get(hs.URL + list)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("LIST: %d, %v", resp.StatusCode, err)
		}
		return time.Since(start)
	}

	first := get()
	if seats, reqs := gauge("apiserver_flowcontrol_current_executing_seats"), gauge("apiserver_flowcontrol_current_executing_requests"); seats != float64(we.InitialSeats) || reqs != 0 {
		t.Fatalf("after the first LIST's response: %g seats and %g requests executing, want its %d seats and no request", seats, reqs, we.InitialSeats)
	}
	second := get()
	if second < we.AdditionalLatency*8/10 {
		t.Errorf("the second LIST took %v (the first %v); want it to wait for the first's seats, %v", second, first, we.AdditionalLatency)
	}
	waitForLevelGauge(t, "apiserver_flowcontrol_current_executing_seats", level, "the seats' release", func(v float64) bool { return v == 0 })
	if got, want := testutil.ToFloat64(lingering.WithLabelValues(level)), 2*float64(we.InitialSeats)*we.AdditionalLatency.Seconds(); got < want*0.999 || got > want*1.001 {
		t.Errorf("lingering seat-seconds counted: %g, want %g", got, want)
	}
	r := requestOf(t, list, "")
	info, _ := request.RequestInfoFrom(r.Context())
	c := srv.Cost(r, info)
	if got, want := learner.Work(seatcpu.List), 2*seatcpu.Work(c.Walked, c.Bytes); got < want-0.01 || got > want+0.01 {
		t.Errorf("the learner counted %g seats' worth of work, want the two LISTs' %g", got, want)
	}
	t.Logf("%d seats lingering %v; LISTs took %v, then %v", we.InitialSeats, we.AdditionalLatency, first, second)
}

// waitForLevelGauge waits up to 30 s for a served apiserver_flowcontrol_*
// gauge at a priority level to satisfy ok.
func waitForLevelGauge(t *testing.T, name, level, what string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := levelGauge(t, name, level)
		if ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s at %s is %g", what, name, level, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// levelGauge is the sum of a served apiserver_flowcontrol_* gauge's
// series at a priority level.
func levelGauge(t *testing.T, name, level string) float64 {
	t.Helper()
	mfs, err := apf.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "priority_level" && l.GetValue() == level {
					sum += m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// replica is a shard replica answering every request with one status.
func replica(t *testing.T, status int) (endpoint string, calls *int) {
	t.Helper()
	n := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		if status == http.StatusOK {
			return
		}
		// What the shard's handlers answer: a Status (e.g. 429 while
		// the resource's initial load runs, 403 from its authorizer).
		st := apierrors.NewTooManyRequests("storage is (re)initializing", 1).ErrStatus
		switch status {
		case http.StatusForbidden:
			st = apierrors.NewForbidden(schema.GroupResource{Resource: "shard"}, "", errors.New("no")).ErrStatus
		case shardwire.StatusMisdirected:
			st = metav1.Status{Status: metav1.StatusFailure, Code: shardwire.StatusMisdirected, Message: "this replica holds hash shards 0-0/2, not " + r.URL.Query().Get(shardwire.ParamHashShards)}
		}
		st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
		body, _ := json.Marshal(st)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://"), &n
}

// closedEndpoint is an address nothing listens on.
func closedEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func clientFor(t *testing.T, endpoints ...string) *Client {
	t.Helper()
	probe := httptest.NewTLSServer(http.NotFoundHandler()) // for its client trusting httptest's certificate
	t.Cleanup(probe.Close)
	topo := &topology.Topology{HashShards: 1, Shards: []topology.Shard{{Name: "shard-0", Replicas: int32(len(endpoints)), Endpoints: endpoints}}}
	return NewClient(probe.Client(), topo, metrics.New(prometheus.NewRegistry()))
}

// TestOpenFailsOverFromALoadingReplica: the shards' Service publishes
// replicas before they are ready, so a front reaches replicas that are
// still loading (429) or not listening yet; another replica answers
// instead, whichever is tried first.
func TestOpenFailsOverFromALoadingReplica(t *testing.T) {
	loading, _ := replica(t, http.StatusTooManyRequests)
	ready, readyCalls := replica(t, http.StatusOK)
	c := clientFor(t, loading, closedEndpoint(t), ready)
	for i := 0; i < 6; i++ { // every rotation of the first replica tried
		s, err := c.open(context.Background(), 0, "/shard/v1/list", nil)
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if s.endpoint != ready {
			t.Fatalf("answered by %s, want the ready replica %s", s.endpoint, ready)
		}
		s.Close()
	}
	if *readyCalls != 6 {
		t.Fatalf("ready replica called %d times, want 6", *readyCalls)
	}
}

// TestOpenAllLoadingIsTooManyRequests: when no replica has its data yet
// the front answers as the apiserver's cacher does while it initializes:
// 429 with a Retry-After, which clients retry.
func TestOpenAllLoadingIsTooManyRequests(t *testing.T) {
	a, _ := replica(t, http.StatusTooManyRequests)
	b, _ := replica(t, http.StatusTooManyRequests)
	_, err := clientFor(t, a, b).open(context.Background(), 0, "/shard/v1/list", nil)
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("want 429, got %v", err)
	}
	if d, ok := apierrors.SuggestsClientDelay(err); !ok || d != 1 {
		t.Fatalf("want Retry-After 1, got %d %v", d, ok)
	}
	if !strings.Contains(err.Error(), "shard-0") {
		t.Fatalf("the error does not name the shard: %v", err)
	}
}

// TestOpenRefusalIsAnAnswer: a replica refusing the front (authorization)
// is a fleet misconfiguration that another replica would repeat; it is
// reported, not hidden by trying the next one.
func TestOpenRefusalIsAnAnswer(t *testing.T) {
	forbidden, _ := replica(t, http.StatusForbidden)
	ready, readyCalls := replica(t, http.StatusOK)
	c := clientFor(t, forbidden, ready)
	c.next[0].Store(1) // the forbidden replica first: (1+1)%2 = 0
	_, err := c.open(context.Background(), 0, "/shard/v1/list", nil)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "refused the front: 403") {
		t.Fatalf("want 503 naming the refusal, got %v", err)
	}
	if *readyCalls != 0 {
		t.Fatal("the next replica was tried after a refusal")
	}
}

// TestOpenNoReplicaAnsweringIsRetryable: when no replica of a shard can be
// reached (its pods are being replaced), the front answers 503 with a
// Retry-After of a second, which client-go retries; a refusal (above) has
// none: retrying would only repeat it.
func TestOpenNoReplicaAnsweringIsRetryable(t *testing.T) {
	_, err := clientFor(t, closedEndpoint(t), closedEndpoint(t)).open(context.Background(), 0, "/shard/v1/list", nil)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "shard-0 is unreachable") {
		t.Fatalf("want 503 naming the shard, got %v", err)
	}
	if d, ok := apierrors.SuggestsClientDelay(err); !ok || d != 1 {
		t.Fatalf("want Retry-After 1, got %d %v", d, ok)
	}
	forbidden, _ := replica(t, http.StatusForbidden)
	_, err = clientFor(t, forbidden).open(context.Background(), 0, "/shard/v1/list", nil)
	if _, ok := apierrors.SuggestsClientDelay(err); ok {
		t.Fatalf("a refusal suggests a retry: %v", err)
	}
}

// TestOpenSkipsReplicasOfAnotherRange: while the shard count changes, a
// shard's replicas roll one at a time onto a new range of hash shards. A
// replica holding another range than the front's topology gives the shard
// refuses (421); the front reads from a replica that holds its range, and
// when none does it answers 503 with Retry-After naming the range — never
// a list or a stream of a different set of objects.
func TestOpenSkipsReplicasOfAnotherRange(t *testing.T) {
	other, otherCalls := replica(t, shardwire.StatusMisdirected)
	ready, readyCalls := replica(t, http.StatusOK)
	c := clientFor(t, other, ready)
	for i := range 4 {
		s, err := c.open(context.Background(), 0, shardwire.PathWatch, url.Values{"resource": {"/v1/configmaps"}})
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if s.endpoint != ready {
			t.Fatalf("answered by %s, want the replica holding the range, %s", s.endpoint, ready)
		}
		s.Close()
	}
	if *readyCalls != 4 || *otherCalls == 0 {
		t.Fatalf("calls: %d to the replica of the range, %d to the other; want 4 and some", *readyCalls, *otherCalls)
	}

	_, err := clientFor(t, other).open(context.Background(), 0, shardwire.PathList, nil)
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "no replica of shard shard-0 holds hash shards 0-0/1") ||
		!strings.Contains(err.Error(), "this replica holds hash shards 0-0/2, not 0-0/1") {
		t.Fatalf("want a 503 naming both ranges, got %v", err)
	}
	if d, ok := apierrors.SuggestsClientDelay(err); !ok || d != 1 {
		t.Fatalf("want Retry-After 1, got %d %v", d, ok)
	}
}

// TestReadsAtAnRVBeforeAReplicasRestart: a replica that restarted loaded
// its shard at a later RV than the front's merged watermark, so it holds
// no state at the RV the front reads at (410 from its store; before that
// fix, an empty answer that dropped the shard's objects from a
// watch-list's initial events). The shard's other replica, which kept
// running, answers instead, whichever replica is tried first: GET, a
// page, a page continued, and a watch-list's scan.
func TestReadsAtAnRVBeforeAReplicasRestart(t *testing.T) {
	objs := testObjects(3, 20)
	f := newListFixture(t, 1, objs) // the replica that kept running: loaded at listRV
	// A history window as the cache-server's: the restart is recent.
	restarted, err := store.New(store.Options{Shards: 16, HistoryWindow: 150 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.Replace(objs, listRV+50); err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.List(store.ListRequest{SnapshotRV: listRV}); !apierrors.IsResourceExpired(err) && !errors.As(err, new(*store.ExpiredError)) {
		t.Fatalf("the restarted replica's store at an RV before its load: %v, want expired", err)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.serve(w, r, restarted) }))
	t.Cleanup(srv.Close)
	sh := &f.src.client.topo.Shards[0]
	sh.Endpoints = append(sh.Endpoints, strings.TrimPrefix(srv.URL, "https://"))
	sh.Replicas = 2

	for i := 0; i < 4; i++ { // each replica tried first, twice
		res, err := f.src.List(store.ListRequest{SnapshotRV: listRV})
		if err != nil || len(res.Items) != len(objs) {
			t.Fatalf("list %d: %d items, %v; want %d", i, len(res.Items), err, len(objs))
		}
		page, err := f.src.List(store.ListRequest{SnapshotRV: listRV, Limit: 7})
		if err != nil || len(page.Items) != 7 || page.ContinueKey == "" {
			t.Fatalf("page %d: %d items, continue %q, %v", i, len(page.Items), page.ContinueKey, err)
		}
		rest, err := f.src.List(store.ListRequest{SnapshotRV: listRV, StartKeyExclusive: page.ContinueKey})
		if err != nil || len(rest.Items) != len(objs)-7 {
			t.Fatalf("continued page %d: %d items, %v; want %d", i, len(rest.Items), err, len(objs)-7)
		}
		n := 0
		if _, err := f.src.Scan(store.ListRequest{SnapshotRV: listRV}, func(*store.Object) bool { n++; return true }); err != nil || n != len(objs) {
			t.Fatalf("scan %d: %d objects, %v; want %d", i, n, err, len(objs))
		}
		o, _, err := f.src.Get(objs[i].Key, listRV)
		if err != nil || o == nil || o.Key != objs[i].Key {
			t.Fatalf("get %d %s: %v, %v", i, objs[i].Key, o, err)
		}
	}
}

// A read of the latest state (RV=0 LIST, GET) whose shard restarted on
// every replica, loading above the front's merged watermark, is served at
// the apiserver's current RV after the shards applied it — as a consistent
// read — never with the restarted store's 410: kube-apiserver does not
// answer 410 to a read of its latest state. A read at an explicit RV (a
// continued page) still gets the 410.
func TestLatestReadAfterEveryReplicaRestarted(t *testing.T) {
	objs := testObjects(3, 20)
	f := newListFixture(t, 1, objs)
	restarted, err := store.New(store.Options{Shards: 16, HistoryWindow: 150 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	loadRV := uint64(listRV + 50)
	if _, err := restarted.Replace(objs, loadRV); err != nil {
		t.Fatal(err)
	}
	// The front's merged watermark, below the restarted replica's load.
	f.src.hub.Progress(listRV)
	var waits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case shardwire.PathCurrentRV, shardwire.PathWait:
			if r.URL.Path == shardwire.PathWait {
				waits.Add(1)
				// The shard's change stream reports its progress.
				f.src.hub.Progress(loadRV)
			}
			out := f.pools.Writer(w)
			defer f.pools.PutWriter(out)
			_ = out.Watermark(loadRV, false)
			_ = out.Flush()
		default:
			f.serve(w, r, restarted)
		}
	}))
	t.Cleanup(srv.Close)
	sh := &f.src.client.topo.Shards[0]
	sh.Endpoints = []string{strings.TrimPrefix(srv.URL, "https://")}

	if _, err := f.src.List(store.ListRequest{SnapshotRV: listRV}); !errors.As(err, new(*store.ExpiredError)) {
		t.Fatalf("a read at RV %d, before every replica's load: %v, want 410 Expired", listRV, err)
	}
	res, err := f.src.List(store.ListRequest{})
	if err != nil || len(res.Items) != len(objs) || res.RV != loadRV {
		t.Fatalf("RV=0 LIST: %d items at RV %d, %v; want %d at %d", len(res.Items), res.RV, err, len(objs), loadRV)
	}
	o, _, err := f.src.Get(objs[3].Key, 0)
	if err != nil || o == nil || o.Key != objs[3].Key {
		t.Fatalf("GET %s: %v, %v", objs[3].Key, o, err)
	}
	if waits.Load() == 0 {
		t.Fatal("served without waiting for the shards to apply the apiserver's RV")
	}
	if n := testutil.ToFloat64(f.src.metrics.FleetLatestReadsRefreshed.WithLabelValues(f.src.label)); n != 1 {
		// The GET found the watermark moved past the load by the LIST's wait.
		t.Fatalf("cachetier_fleet_latest_reads_refreshed_total %v, want 1", n)
	}
}

package front

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// costPods are n pods in namespaces ns-0..ns-(namespaces-1) (round
// robin) on nodes node-0..node-(nodes-1) (round robin), every tenth
// unscheduled.
func costPods(n, namespaces, nodes int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		node := fmt.Sprintf(`"nodeName":"node-%d",`, i%nodes)
		if i%10 == 9 {
			node = ""
		}
		out[i] = fmt.Appendf(nil, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"pod-%06d","namespace":"ns-%d","uid":"6a1c3f55-4f2a-4d8f-9d5e-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-21T10:00:00Z","labels":{"app":"a%d"}},"spec":{%s"containers":[{"name":"app","image":"registry.example.com/app:1"}]},"status":{"phase":"Running"}}`,
			i, i%namespaces, i, 1000+i, i%3, node)
	}
	return out
}

// TestCostOfRequestShapes: the cost of the requests real clients send, as
// the tier will serve them: what is walked follows the namespace and the
// node index, pages walk their page, watches without initial events and
// GETs are one object, forms built whole are held.
func TestCostOfRequestShapes(t *testing.T) {
	const n, namespaces, nodes = 2000, 4, 20
	objs := costPods(n, namespaces, nodes)
	tier := newBenchTierOf(t, objs, benchResource{resource: "pods", kind: "Pod"}, true, true)
	defer tier.stop()
	size := 0
	for _, o := range objs {
		size += len(o)
	}
	onNode := 0
	for i := range n {
		if i%10 != 9 && i%nodes == 1 {
			onNode++
		}
	}
	infos := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	const table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
	const protobuf = "application/vnd.kubernetes.protobuf,application/json"
	for _, tc := range []struct {
		name, target, accept string
		kind                 CostKind
		walked, returned     int64
		held                 bool
	}{
		{"kubelet: its node's pods (list)", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&limit=500&resourceVersion=0", "", CostList, int64(onNode), int64(onNode), false},
		{"kubelet: its node's pods (watch)", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=1500&timeoutSeconds=400&watch=true&allowWatchBookmarks=true", "", CostWatch, 0, 0, false},
		{"kubelet: its node's pods (watch-list)", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1&watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", "", CostWatchList, int64(onNode), int64(onNode), false},
		{"informer: watch-list", "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=500", protobuf, CostWatchList, n, n, false},
		{"informer: legacy watch from RV 0", "/api/v1/pods?watch=true&resourceVersion=0", "", CostWatchList, n, n, false},
		{"full consistent LIST", "/api/v1/pods", "", CostList, n, n, false},
		{"paginated LIST, first page", "/api/v1/pods?limit=500", "", CostList, 500, 500, false},
		{"LIST with a label selector, a page", "/api/v1/pods?labelSelector=app%3Da1&limit=100", "", CostList, n, 100, false},
		{"namespaced LIST", "/api/v1/namespaces/ns-1/pods", "", CostList, n / namespaces, n / namespaces, false},
		{"GET", "/api/v1/namespaces/ns-1/pods/pod-000001", "", CostGet, 1, 1, false},
		{"LIST of one name", "/api/v1/namespaces/ns-1/pods?fieldSelector=metadata.name%3Dpod-000001", "", CostGet, 1, 1, false},
		{"kubectl get: a Table", "/api/v1/namespaces/ns-1/pods?limit=500", table, CostList, n / namespaces, n / namespaces, true},
		{"protobuf LIST", "/api/v1/pods", protobuf, CostList, n, n, true},
		{"not a cached resource", "/api/v1/secrets", "", CostOther, 0, 0, false},
		{"discovery", "/apis", "", CostOther, 0, 0, false},
		{"a write", "/api/v1/namespaces/ns-1/pods", "", CostOther, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodGet
			if tc.name == "a write" {
				method = http.MethodPost
			}
			r := httptest.NewRequest(method, tc.target, nil)
			if tc.accept != "" {
				r.Header.Set("Accept", tc.accept)
			}
			info, err := infos.NewRequestInfo(r)
			if err != nil {
				t.Fatal(err)
			}
			c := tier.srv.Cost(r, info)
			if c.Kind != tc.kind || c.Walked != tc.walked || c.Returned != tc.returned {
				t.Fatalf("%s: %+v, want kind %s, walked %d, returned %d", tc.target, c, tc.kind, tc.walked, tc.returned)
			}
			if want := int64(size) * tc.returned / n; c.Kind == CostList || c.Kind == CostWatchList {
				// Bytes are the returned objects at the average size.
				if d := c.Bytes - want; d > want/50+1 || d < -want/50-1 {
					t.Errorf("%d bytes, want about %d", c.Bytes, want)
				}
			}
			if (c.Held > 0) != tc.held {
				t.Errorf("held %d bytes, want held: %v", c.Held, tc.held)
			}
			if strings.Contains(tc.accept, "Table") && c.Held < c.Bytes*tableHeldFactor {
				t.Errorf("a Table holds %d, want at least %d", c.Held, c.Bytes*tableHeldFactor)
			}
		})
	}
}

// An unfiltered watch-list collects its initial state in one allocation of
// its range's count; a filtered one grows as it goes.
func TestInitialCapacity(t *testing.T) {
	const n, namespaces, nodes = 300, 3, 10
	tier := newBenchTierOf(t, costPods(n, namespaces, nodes), benchResource{resource: "pods", kind: "Pod"}, true, true)
	defer tier.stop()
	res := tier.srv.resources[schema.GroupVersionResource{Version: "v1", Resource: "pods"}]
	match := func(*store.Object) bool { return true }
	for _, tc := range []struct {
		name string
		req  watch.Request
		want int
	}{
		{"all", watch.Request{}, n},
		{"a namespace", watch.Request{Namespace: "ns-1"}, n / namespaces},
		{"a selector", watch.Request{Match: match}, 0},
		{"a node's, through the index", watch.Request{Match: match, Index: store.IndexValue{Field: "spec.nodeName", Value: "node-1"}}, 0},
	} {
		if got := initialCapacity(res, tc.req); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// shardCostingSource is a store read as a fleet's front reads it: its
// shards report their CPU per seat's worth of work.
type shardCostingSource struct {
	LocalSource
	cpu time.Duration
}

func (s shardCostingSource) ShardSeatCPU() time.Duration { return s.cpu }

// TestCostCarriesTheShardsCPU: a front's LISTs and watch-lists carry its
// shards' CPU per seat's worth of work, which its estimator charges
// beside its own; a local store's carry none.
func TestCostCarriesTheShardsCPU(t *testing.T) {
	bt := newBenchTierFields(t, benchObjects(100, 1024), true, false)
	defer bt.stop()
	infos := &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}
	cost := func(srv *Server, target string) Cost {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, target, nil)
		info, err := infos.NewRequestInfo(r)
		if err != nil {
			t.Fatal(err)
		}
		return srv.Cost(r, info)
	}
	const shardCPU = 300 * time.Microsecond
	front := serverOver(t, bt, shardCostingSource{LocalSource: LocalSource{Ingester: bt.ing}, cpu: shardCPU})
	for _, target := range []string{"/api/v1/configmaps", "/api/v1/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"} {
		if c := cost(front, target); c.ShardSeatCPU != shardCPU || c.Walked != 100 {
			t.Errorf("%s on a front: %+v, want the shards' %v", target, c, shardCPU)
		}
		if c := cost(bt.srv, target); c.ShardSeatCPU != 0 || c.Walked != 100 {
			t.Errorf("%s on a local store: %+v, want no shards' CPU", target, c)
		}
	}
}

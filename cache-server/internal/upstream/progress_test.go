package upstream

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// A probe that ends without a bookmark is a miss only if one was due: the
// apiserver had confirmed an RV above what the watch delivered before the
// probe opened. Three misses in a row make a resource that never showed
// a bookmark bookmarkless; one that did show one stays.
func TestProbeEndedWithoutBookmark(t *testing.T) {
	newIn := func() *Ingester {
		st, _ := store.New(store.Options{Shards: 1})
		return New(Options{
			Resource: Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespaced: true},
			Store:    st, Metrics: metrics.New(prometheus.NewRegistry()), Log: logr.Discard(),
		})
	}
	in := newIn()
	// Nothing newer known when it opened, or the watch itself delivered
	// up to it: no bookmark was due.
	for _, c := range []struct{ from, sent, latest uint64 }{{10, 10, 10}, {10, 10, 5}, {10, 20, 20}} {
		if got := in.probeEndedWithoutBookmark(c.from, c.sent, c.latest); got != probeNothingDue {
			t.Errorf("from %d sent %d latest %d: %s, want %s", c.from, c.sent, c.latest, got, probeNothingDue)
		}
	}
	if in.probeMisses.Load() != 0 {
		t.Fatal("a probe with nothing due counted as a miss")
	}
	for i := 1; i < probeMissesForBookmarkless; i++ {
		if got := in.probeEndedWithoutBookmark(10, 12, 15); got != probeLate {
			t.Fatalf("miss %d: %s, want %s", i, got, probeLate)
		}
	}
	if got := in.probeEndedWithoutBookmark(10, 10, 15); got != probeBecameBookmarkless || !in.bookmarkless.Load() {
		t.Fatalf("miss %d: %s (bookmarkless %v), want %s", probeMissesForBookmarkless, got, in.bookmarkless.Load(), probeBecameBookmarkless)
	}

	in = newIn()
	in.sawBookmark.Store(true)
	for i := 0; i < 2*probeMissesForBookmarkless; i++ {
		if got := in.probeEndedWithoutBookmark(10, 10, 15); got != probeLate {
			t.Fatalf("a resource that showed bookmarks, miss %d: %s, want %s", i+1, got, probeLate)
		}
	}
}

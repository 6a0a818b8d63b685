package upstream

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

type fakeNamespaces struct {
	mu     sync.Mutex
	labels map[string]map[string]string
	synced chan struct{}
}

func (f *fakeNamespaces) Synced() <-chan struct{} { return f.synced }
func (f *fakeNamespaces) Labels(ns string) (map[string]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.labels[ns]
	return l, ok
}
func (f *fakeNamespaces) Subscribe(func(string)) {}
func (f *fakeNamespaces) set(ns string, l map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.labels[ns] = l
}

func nsObj(ns, name string, rv uint64) *store.Object {
	return &store.Object{Key: keyhash.Key(ns, name), Namespace: ns, Name: name, RV: rv, Raw: fmt.Appendf(nil, `{"rv":%d}`, rv)}
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(evs []store.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range evs {
		r.events = append(r.events, fmt.Sprintf("%s %s@%d", e.Type, e.Object.Key, e.RV))
	}
}

func (r *recorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	sort.Strings(r.events)
	s := strings.Join(r.events, ",")
	r.events = nil
	return s
}

func newFilteredIngester(t *testing.T) (*Ingester, *fakeNamespaces, *recorder) {
	t.Helper()
	st, err := store.New(store.Options{Shards: 3})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNamespaces{labels: map[string]map[string]string{
		"a": {"team": "x"}, "b": {"team": "y"},
	}, synced: make(chan struct{})}
	close(f.synced)
	rec := &recorder{}
	in := New(Options{
		Resource: Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
		Store:    st, Metrics: metrics.New(prometheus.NewRegistry()), Log: logr.Discard(),
		OnRelist: func(evs []store.Event, _ uint64) { rec.add(evs) },
		OnEvents: rec.add,
		Namespaces: &NamespaceFilter{
			Selector:   labels.SelectorFromSet(labels.Set{"team": "x"}),
			Namespaces: f,
		},
	})
	return in, f, rec
}

func keysOf(t *testing.T, st *store.Store) string {
	t.Helper()
	res, err := st.List(store.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range res.Items {
		out = append(out, fmt.Sprintf("%s@%d", o.Key, o.RV))
	}
	return strings.Join(out, " ")
}

func TestNamespaceFilterAtIngestion(t *testing.T) {
	in, _, rec := newFilteredIngester(t)
	if err := in.replace([]*store.Object{nsObj("a", "1", 10), nsObj("b", "1", 11), nsObj("c", "1", 12)}, 20); err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(t, in.Store()), "a/1@10"; got != want {
		t.Fatalf("after load: %s, want %s", got, want)
	}
	rec.take()
	// Events outside the selector are dropped but still count as progress.
	for _, ev := range []store.Event{
		{Type: store.Added, Object: nsObj("b", "2", 21), RV: 21},
		{Type: store.Added, Object: nsObj("a", "2", 22), RV: 22},
		{Type: store.Added, Object: nsObj("unknown", "1", 23), RV: 23},
	} {
		if err := in.apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := keysOf(t, in.Store()), "a/1@10 a/2@22"; got != want {
		t.Fatalf("after events: %s, want %s", got, want)
	}
	if in.AppliedRV() != 23 || in.Store().AppliedRV() != 23 {
		t.Fatalf("applied RV %d / store %d, want 23: dropped events must still advance progress", in.AppliedRV(), in.Store().AppliedRV())
	}
	if got := rec.take(); got != "ADDED a/2@22" {
		t.Fatalf("downstream events %q", got)
	}
}

func TestNamespaceLeaveAndEnter(t *testing.T) {
	in, f, rec := newFilteredIngester(t)
	ctx := context.Background()
	if err := in.replace([]*store.Object{nsObj("a", "1", 10), nsObj("b", "1", 11), nsObj("b", "2", 12)}, 20); err != nil {
		t.Fatal(err)
	}
	rec.take()

	// a stops matching: its objects leave, as DELETED events.
	f.set("a", map[string]string{"team": "z"})
	if err := in.syncNamespace(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(t, in.Store()); got != "" {
		t.Fatalf("after a left: %q", got)
	}
	if got := rec.take(); got != "DELETED a/1@20" {
		t.Fatalf("leave events %q", got)
	}

	// b starts matching. While its LIST is in flight the stream delivers
	// b/2 deleted (newer than the LIST) and b/3 added; the LIST (at RV 25)
	// still has b/1 at 11, b/2 at 12, and b/4 deleted later at 26.
	f.set("b", map[string]string{"team": "x"})
	in.nsList = func(ctx context.Context, ns string) ([]*store.Object, uint64, error) {
		if ns != "b" {
			t.Errorf("listed namespace %q", ns)
		}
		for _, ev := range []store.Event{
			{Type: store.Deleted, Object: nsObj("b", "2", 24), RV: 24},
			{Type: store.Added, Object: nsObj("b", "3", 25), RV: 25},
			{Type: store.Deleted, Object: nsObj("b", "4", 26), RV: 26},
		} {
			if err := in.apply(ev); err != nil {
				t.Error(err)
			}
		}
		// A consistent LIST at 23: before the delete of b/2 and the add.
		return []*store.Object{nsObj("b", "1", 11), nsObj("b", "2", 12), nsObj("b", "4", 13)}, 23, nil
	}
	if got := keysOf(t, in.Store()); got != "" {
		t.Fatalf("a pending namespace must not be visible: %q", got)
	}
	if err := in.syncNamespace(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(t, in.Store()), "b/1@11 b/3@25"; got != want {
		t.Fatalf("after b entered: %q, want %q", got, want)
	}
	if got, want := rec.take(), "ADDED b/1@26,ADDED b/3@26"; got != want {
		t.Fatalf("enter events %q, want %q", got, want)
	}
	// Now admitted: live events apply directly.
	if err := in.apply(store.Event{Type: store.Modified, Object: nsObj("b", "1", 27), RV: 27}); err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(t, in.Store()), "b/1@27 b/3@25"; got != want {
		t.Fatalf("after live event: %q, want %q", got, want)
	}
	// Idempotent: no change, no events.
	if err := in.syncNamespace(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got := rec.take(); got != "MODIFIED b/1@27" {
		t.Fatalf("events %q", got)
	}
}

// A relist while a namespace is being entered recomputes membership and the
// entry is abandoned without touching the store.
func TestNamespaceEnterRacingRelist(t *testing.T) {
	in, f, _ := newFilteredIngester(t)
	ctx := context.Background()
	if err := in.replace([]*store.Object{nsObj("b", "1", 11)}, 20); err != nil {
		t.Fatal(err)
	}
	f.set("b", map[string]string{"team": "x"})
	in.nsList = func(ctx context.Context, ns string) ([]*store.Object, uint64, error) {
		if err := in.replace([]*store.Object{nsObj("b", "1", 11), nsObj("b", "2", 30)}, 30); err != nil {
			t.Error(err)
		}
		return []*store.Object{nsObj("b", "1", 11)}, 25, nil
	}
	if err := in.syncNamespace(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got, want := keysOf(t, in.Store()), "b/1@11 b/2@30"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestMergeNamespace(t *testing.T) {
	buf := &nsBuffer{events: map[string]store.Event{
		keyhash.Key("n", "old"):     {Type: store.Modified, Object: nsObj("n", "old", 5), RV: 5}, // older than listed: list wins
		keyhash.Key("n", "new"):     {Type: store.Modified, Object: nsObj("n", "new", 9), RV: 9},
		keyhash.Key("n", "gone"):    {Type: store.Deleted, Object: nsObj("n", "gone", 9), RV: 9},
		keyhash.Key("n", "created"): {Type: store.Added, Object: nsObj("n", "created", 9), RV: 9},
		keyhash.Key("n", "dead"):    {Type: store.Deleted, Object: nsObj("n", "dead", 9), RV: 9},
	}}
	listed := []*store.Object{nsObj("n", "old", 7), nsObj("n", "new", 7), nsObj("n", "gone", 7), nsObj("n", "same", 7)}
	var got []string
	for _, o := range mergeNamespace(listed, buf) {
		got = append(got, fmt.Sprintf("%s@%d", o.Name, o.RV))
	}
	sort.Strings(got)
	if w := "created@9 new@9 old@7 same@7"; strings.Join(got, " ") != w {
		t.Fatalf("merged %v, want %s", got, w)
	}
}

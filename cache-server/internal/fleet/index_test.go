package fleet

import (
	"bytes"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// A fleet's indexed pages are those of one store holding every object,
// under both continuation rules: the shards read their indexes and report
// continuation and last keys by the rule the front sent, and the front's
// merge needs nothing else.

// podObjects are pods over a few nodes, every seventh unscheduled (no
// spec.nodeName at all), in several namespaces.
func podObjects(namespaces, perNamespace int) []*store.Object {
	var objs []*store.Object
	for n := range namespaces {
		ns := fmt.Sprintf("ns-%02d", n)
		for i := range perNamespace {
			name := fmt.Sprintf("pod-%04d", i)
			raw := fmt.Sprintf(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"resourceVersion":"%d"}}`, name, ns, 10+i)
			o := &store.Object{Key: keyhash.Key(ns, name), Namespace: ns, Name: name, RV: uint64(10 + i), Raw: []byte(raw),
				Labels: map[string]string{"app": fmt.Sprint("a", i%3)}, Fields: map[string]string{"status.phase": "Running"}}
			if i%7 != 0 {
				// Node by blocks, so that nodes are runs in key order
				// with other nodes' pods after them.
				o.Fields["spec.nodeName"] = fmt.Sprintf("node-%d", (i/5)%4)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

type indexedCase struct {
	ns, label, field string
	limit            int64
	index            store.IndexValue
	byIndex          bool
}

func (c indexedCase) request() store.ListRequest {
	ls, err := labels.Parse(c.label)
	if err != nil {
		panic(err)
	}
	fs, err := fields.ParseSelector(c.field)
	if err != nil {
		panic(err)
	}
	return store.ListRequest{SnapshotRV: listRV, Namespace: c.ns, Limit: c.limit, Index: c.index, ContinueByIndex: c.byIndex,
		Match:    func(o *store.Object) bool { return ls.Matches(labels.Set(o.Labels)) && fs.Matches(o.FieldSet()) },
		Selector: store.Selector{Label: c.label, Field: c.field}}
}

func TestIndexedListMatchesOneStore(t *testing.T) {
	objs := podObjects(3, 60)
	for _, shards := range []int{1, 2, 3} {
		f := newListFixtureIndexed(t, shards, objs, false, []string{"spec.nodeName"})
		for _, node := range []string{"node-0", "node-3", "", "node-9"} {
			for _, ns := range []string{"", "ns-01"} {
				for _, label := range []string{"", "app=a1"} {
					// Pages of exactly the matches (and one less or more):
					// where the rules differ when objects follow.
					matches, err := f.all.List(indexedCase{ns: ns, label: label, field: "spec.nodeName=" + node}.request())
					if err != nil {
						t.Fatal(err)
					}
					n := int64(len(matches.Items))
					for _, limit := range []int64{0, 1, 4, 5, 37, 500, n - 1, n, n + 1} {
						if testing.Short() && limit == 1 {
							// Page-by-page walks of every match: the
							// longest cases under the race detector (make
							// test-race runs -short); the full run keeps them.
							continue
						}
						for _, byIndex := range []bool{false, true} {
							c := indexedCase{ns: ns, label: label, field: "spec.nodeName=" + node, limit: max(limit, 0),
								index: store.IndexValue{Field: "spec.nodeName", Value: node}, byIndex: byIndex}
							t.Run(fmt.Sprintf("%dshards/%+v", shards, c), func(t *testing.T) {
								f.walkRequest(t, c, c.request(), f.src.List)
								f.walkRequest(t, c, c.request(), f.streamed)
								var got []string
								if _, err := f.src.Scan(c.request(), func(o *store.Object) bool { got = append(got, o.Key); return true }); err != nil {
									t.Fatal(err)
								}
								want, err := f.all.List(store.ListRequest{SnapshotRV: listRV, Namespace: c.ns, Match: c.request().Match})
								if err != nil {
									t.Fatal(err)
								}
								if len(got) != len(want.Items) {
									t.Fatalf("scan: %d items, want %d", len(got), len(want.Items))
								}
								for i, o := range want.Items {
									if got[i] != o.Key {
										t.Fatalf("scan item %d: %s, want %s", i, got[i], o.Key)
									}
								}
								// Handed out in place (a front's watch-list
								// by content): the same bytes and RVs.
								transient := c.request()
								transient.Transient = true
								i := 0
								if _, err := f.src.Scan(transient, func(o *store.Object) bool {
									if i >= len(want.Items) || !bytes.Equal(o.Raw, want.Items[i].Raw) || o.RV != want.Items[i].RV {
										t.Fatalf("transient scan item %d: RV %d %.80s, want %d items", i, o.RV, o.Raw, len(want.Items))
									}
									i++
									return true
								}); err != nil || i != len(want.Items) {
									t.Fatalf("transient scan: %d items, %v; want %d", i, err, len(want.Items))
								}
							})
						}
					}
				}
			}
		}
		// An index on a field the shards do not keep (a profile the front
		// has and the shards not yet): filtered, same answers.
		c := indexedCase{field: "status.phase=Running", limit: 7, index: store.IndexValue{Field: "status.phase", Value: "Running"}}
		f.walkRequest(t, c, c.request(), f.src.List)
	}
}

// The rules differ exactly where a node's last pod ends a full page and
// other pods follow it: the apiserver's index has nothing after it, a scan
// has.
func TestIndexedListContinuationRules(t *testing.T) {
	objs := podObjects(1, 60)
	var onNode int64
	for _, o := range objs {
		if o.Fields["spec.nodeName"] == "node-1" {
			onNode++
		}
	}
	f := newListFixtureIndexed(t, 2, objs, false, []string{"spec.nodeName"})
	for _, byIndex := range []bool{false, true} {
		c := indexedCase{field: "spec.nodeName=node-1", limit: onNode, index: store.IndexValue{Field: "spec.nodeName", Value: "node-1"}, byIndex: byIndex}
		page, err := f.src.List(c.request())
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(page.Items)) != onNode || (page.ContinueKey == "") != byIndex {
			t.Errorf("byIndex %v: %d items, continue %q", byIndex, len(page.Items), page.ContinueKey)
		}
	}
}

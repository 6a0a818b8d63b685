package shardserver

import (
	"bytes"
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// A shard refuses an index that is not an equality of the field selector
// it got (reading through it would drop objects the selector matches) and
// malformed index parameters, with a 400; a good one is read.
func TestListStoreIndexParameters(t *testing.T) {
	st, err := store.New(store.Options{Shards: 2, Indexes: []string{"spec.nodeName"}})
	if err != nil {
		t.Fatal(err)
	}
	var objs []*store.Object
	for i, node := range []string{"n1", "n2", "n1", ""} {
		name := string(rune('a' + i))
		objs = append(objs, &store.Object{Key: "ns/" + name, Namespace: "ns", Name: name, RV: 1, Raw: []byte("{}"),
			Fields: map[string]string{"spec.nodeName": node}})
	}
	if _, err := st.Replace(objs, 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query string
		items int // -1: a 400
	}{
		{"fieldSelector=spec.nodeName%3Dn1&index=spec.nodeName&indexValue=n1&continueByIndex=true", 2},
		{"fieldSelector=spec.nodeName%3D&index=spec.nodeName&indexValue=", 1},
		{"fieldSelector=spec.nodeName%3Dn1&index=spec.nodeName&indexValue=n2", -1},
		{"fieldSelector=spec.nodeName!%3Dn1&index=spec.nodeName&indexValue=n1", -1},
		{"index=spec.nodeName&indexValue=n1", -1},
		{"fieldSelector=spec.nodeName%3Dn1&index=spec.nodeName&indexValue=n1&continueByIndex=maybe", -1},
		{"fieldSelector=spec.nodeName%3Dn1&indexValue=n1", -1},
	} {
		q, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		for _, limit := range []uint64{0, 5} {
			var buf bytes.Buffer
			out := shardwire.NewWriter(&buf)
			err = ListStore(out, st, q, 1, limit)
			if c.items < 0 {
				if !apierrors.IsBadRequest(err) {
					t.Errorf("%s limit %d: %v, want a 400", c.query, limit, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", c.query, err)
			}
			_ = out.Flush()
			r := shardwire.NewReader(&buf)
			n := 0
			for {
				rec, err := r.Next()
				if err != nil {
					t.Fatal(err)
				}
				if rec.Kind == shardwire.KindEnd {
					break
				}
				n++
			}
			if n != c.items {
				t.Errorf("%s limit %d: %d items, want %d", c.query, limit, n, c.items)
			}
		}
	}
}

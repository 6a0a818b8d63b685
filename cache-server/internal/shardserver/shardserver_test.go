package shardserver

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"

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
			items, _, err := listStore(t, st, q, limit)
			if c.items < 0 {
				if !apierrors.IsBadRequest(err) {
					t.Errorf("%s limit %d: %v, want a 400", c.query, limit, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", c.query, err)
			}
			if len(items) != c.items {
				t.Errorf("%s limit %d: %d items, want %d", c.query, limit, len(items), c.items)
			}
		}
	}
}

// listStore runs ListStore at RV 1 and reads back what it wrote: the
// items up to the end record, and the kind of the first record.
func listStore(t *testing.T, st *store.Store, q url.Values, limit uint64) (items []*store.Object, first shardwire.Kind, err error) {
	t.Helper()
	var buf bytes.Buffer
	out := shardwire.NewWriter(&buf)
	if err := ListStore(out, st, q, 1, limit); err != nil {
		return nil, 0, err
	}
	_ = out.Flush()
	if buf.Len() > 0 {
		first = shardwire.Kind(buf.Bytes()[0])
	}
	r := shardwire.NewReader(&buf)
	for {
		rec, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if rec.Kind == shardwire.KindEnd {
			return items, first, nil
		}
		items = append(items, rec.Object)
	}
}

// A list sends its items' content hashes only to a front that asks for
// them in the hash the shard computes (an older front, or one asking for
// another hash, reads plain object records), by page, whole scan and key.
func TestListStoreContentHashes(t *testing.T) {
	st, err := store.New(store.Options{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	var objs []*store.Object
	for _, name := range []string{"a", "b", "c"} {
		raw := []byte(`{"n":"` + name + `"}`)
		objs = append(objs, &store.Object{Key: "ns/" + name, Namespace: "ns", Name: name, RV: 1, Raw: raw, ContentHash: store.HashContent(raw)})
	}
	if _, err := st.Replace(objs, 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query  string
		hashed bool
	}{
		{"", false},
		{"contentHash=xxhash64", true},
		{"contentHash=xxh3", false},
		{"key=ns%2Fb&contentHash=xxhash64", true},
		{"key=ns%2Fb", false},
	} {
		q, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		for _, limit := range []uint64{0, 2} {
			items, first, err := listStore(t, st, q, limit)
			if err != nil {
				t.Fatalf("%s: %v", c.query, err)
			}
			want := map[bool]shardwire.Kind{true: shardwire.KindHashedObject, false: shardwire.KindObject}[c.hashed]
			if len(items) == 0 || first != want {
				t.Errorf("%q limit %d: %d items, first record kind %q, want %q", c.query, limit, len(items), first, want)
			}
			for _, o := range items {
				hash := uint64(0)
				if c.hashed {
					hash = store.HashContent(o.Raw)
				}
				if o.ContentHash != hash {
					t.Errorf("%q limit %d: %s with content hash %x, want %x", c.query, limit, o.Key, o.ContentHash, hash)
				}
			}
		}
	}
}

// A replica answers only for the hash shards it holds: a front whose
// topology gives the shard another range (the shard count is changing and
// one of the two has not rolled yet) gets 421 naming both ranges, which
// its client reads as "try another replica"; a malformed range is a 400;
// a request that names none (or the right one) reaches the resource.
func TestRequestsForOtherHashShardsRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(nil, shardwire.HashRange{First: 2, Last: 3, Total: 4}, nil, bulkthread.NewSlots(1), metrics.New(reg), logr.Discard())
	for _, c := range []struct {
		query  string
		status int
		says   string
	}{
		{"resource=x&hashShards=2-3/4", http.StatusOK, "cached-resources"}, // on to the resource: not found, in-stream
		{"resource=x", http.StatusOK, "cached-resources"},
		{"resource=x&hashShards=2-2/4", shardwire.StatusMisdirected, "holds hash shards 2-3/4, not 2-2/4"},
		{"resource=x&hashShards=2-3/8", shardwire.StatusMisdirected, "holds hash shards 2-3/4, not 2-3/8"},
		{"resource=x&hashShards=3-2/4", http.StatusBadRequest, "not a range"},
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, shardwire.PathWatch+"?"+c.query, nil))
		if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.says) {
			t.Errorf("%s: %d %q, want %d saying %q", c.query, rec.Code, rec.Body.String(), c.status, c.says)
		}
		if c.status != http.StatusOK {
			var st metav1.Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Kind != "Status" || int(st.Code) != c.status {
				t.Errorf("%s: the body is not a Status with code %d: %v %+v", c.query, c.status, err, st)
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	misdirected := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "cachetier_shard_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "misdirected" {
					misdirected += m.GetCounter().GetValue()
				}
			}
		}
	}
	if misdirected != 2 {
		t.Errorf("cachetier_shard_requests_total{outcome=\"misdirected\"} = %v, want 2", misdirected)
	}
}

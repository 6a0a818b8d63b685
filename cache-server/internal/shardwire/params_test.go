package shardwire

import (
	"errors"
	"net/http"
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

func TestIndexParamsRoundTrip(t *testing.T) {
	for _, c := range []struct {
		iv      store.IndexValue
		byIndex bool
	}{
		{store.IndexValue{}, false},
		{store.IndexValue{Field: "spec.nodeName", Value: "node-1"}, true},
		{store.IndexValue{Field: "spec.nodeName", Value: ""}, true}, // unscheduled pods
		{store.IndexValue{Field: "status.phase", Value: "Running"}, false},
		{store.IndexValue{Field: "spec.color", Value: "a&b=c d"}, false},
	} {
		q := url.Values{"resource": {"/v1/pods"}}
		SetIndex(q, c.iv, c.byIndex)
		// Through the URL, as a shard reads it.
		back, err := url.ParseQuery(q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		iv, byIndex, err := ParseIndex(back)
		if err != nil || iv != c.iv || byIndex != (c.byIndex && c.iv.Field != "") {
			t.Errorf("%+v %v: parsed %+v %v %v", c.iv, c.byIndex, iv, byIndex, err)
		}
	}
}

// Every malformed combination is a 400, never a guess.
func TestIndexParamsRejected(t *testing.T) {
	for _, raw := range []string{
		"indexValue=n1",
		"continueByIndex=true",
		"index=&indexValue=n1",
		"index=spec.nodeName",
		"index=spec.nodeName&indexValue=n1&continueByIndex=yes please",
		"index=spec.nodeName&indexValue=n1&continueByIndex=",
		"index=spec.nodeName&index=status.phase&indexValue=n1",
		"index=spec.nodeName&indexValue=n1&indexValue=n2",
		"index=spec.nodeName&indexValue=n1&continueByIndex=true&continueByIndex=false",
	} {
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = ParseIndex(q)
		var status apierrors.APIStatus
		if err == nil || !errors.As(err, &status) || status.Status().Code != http.StatusBadRequest {
			t.Errorf("%s: %v, want a 400", raw, err)
		}
	}
}

func FuzzParseIndex(f *testing.F) {
	type index struct {
		iv      store.IndexValue
		byIndex bool
	}
	fuzzParam(f, []string{
		"index=spec.nodeName&indexValue=n1&continueByIndex=true",
		"index=spec.nodeName&indexValue=",
		"indexValue=x&continueByIndex=0",
	}, func(q url.Values) (index, error) {
		iv, byIndex, err := ParseIndex(q)
		return index{iv, byIndex}, err
	}, func(q url.Values, x index) { SetIndex(q, x.iv, x.byIndex) }, nil)
}

func TestBulkNiceParam(t *testing.T) {
	for _, nice := range []int{0, 1, 10, 19} {
		q := url.Values{}
		SetBulkNice(q, nice)
		if got, err := ParseBulkNice(q); err != nil || got != nice {
			t.Errorf("nice %d read back as %d, %v", nice, got, err)
		}
		if _, sent := q[ParamBulkNice]; sent != (nice != 0) {
			t.Errorf("nice %d: parameter sent %v", nice, sent)
		}
	}
	for _, raw := range []string{"bulkNice=", "bulkNice=0", "bulkNice=20", "bulkNice=-1", "bulkNice=ten", "bulkNice=5&bulkNice=5"} {
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseBulkNice(q); !apierrors.IsBadRequest(err) {
			t.Errorf("%s: %v, want a 400", raw, err)
		}
	}
	// Built in code rather than parsed: a key with no values.
	if _, err := ParseBulkNice(url.Values{ParamBulkNice: nil}); !apierrors.IsBadRequest(err) {
		t.Errorf("no values: %v, want a 400", err)
	}
}

func FuzzParseBulkNice(f *testing.F) {
	fuzzParam(f, []string{"bulkNice=10", "bulkNice=+7", "bulkNice=019&bulkNice=1"}, ParseBulkNice, SetBulkNice,
		func(t *testing.T, q url.Values, nice int) {
			if _, sent := q[ParamBulkNice]; sent != (nice != 0) || nice < 0 || nice > 19 {
				t.Fatalf("%v: read as nice %d", q, nice)
			}
		})
}

// fuzzParam fuzzes the parser of a shard request's query parameters:
// what it refuses it refuses with a 400, and what it accepts (checked by
// check, if given) set writes so that parse reads it back the same.
func fuzzParam[T comparable](f *testing.F, seeds []string, parse func(url.Values) (T, error), set func(url.Values, T), check func(*testing.T, url.Values, T)) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		v, err := parse(q)
		if err != nil {
			if !apierrors.IsBadRequest(err) {
				t.Fatalf("%q: %v is not a 400", raw, err)
			}
			return
		}
		if check != nil {
			check(t, q, v)
		}
		again := url.Values{}
		set(again, v)
		if v2, err := parse(again); err != nil || v2 != v {
			t.Fatalf("%q: %+v, written and read back %+v %v", raw, v, v2, err)
		}
	})
}

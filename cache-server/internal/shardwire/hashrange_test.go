package shardwire

import (
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

func TestHashRangeRoundTrip(t *testing.T) {
	for _, r := range []HashRange{{0, 0, 1}, {0, 7, 16}, {11, 15, 16}, {3, 3, 4}} {
		q := url.Values{"resource": {"/v1/pods"}}
		SetHashRange(q, r)
		back, err := url.ParseQuery(q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		got, ok, err := ParseHashRange(back)
		if err != nil || !ok || got != r {
			t.Errorf("%v: parsed %v %v %v", r, got, ok, err)
		}
	}
	if _, ok, err := ParseHashRange(url.Values{"resource": {"/v1/pods"}}); ok || err != nil {
		t.Errorf("no range: %v %v, want none and no error", ok, err)
	}
}

// Every malformed or impossible range is a 400, never a guess.
func TestHashRangeRejected(t *testing.T) {
	for _, raw := range []string{
		"hashShards=",
		"hashShards=0-7",
		"hashShards=0/16",
		"hashShards=7-0/16",
		"hashShards=0-16/16",
		"hashShards=-1-3/16",
		"hashShards=0-3/16&hashShards=4-7/16",
		"hashShards=a-b/c",
		"hashShards=0-3/99999999999",
	} {
		q, err := url.ParseQuery(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ParseHashRange(q); !apierrors.IsBadRequest(err) {
			t.Errorf("%s: %v, want a 400", raw, err)
		}
	}
}

func FuzzParseHashRange(f *testing.F) {
	type hashRange struct {
		r  HashRange
		ok bool
	}
	fuzzParam(f, []string{"hashShards=0-7/16", "hashShards=3-3/4", "hashShards=1-0/2"},
		func(q url.Values) (hashRange, error) {
			r, ok, err := ParseHashRange(q)
			return hashRange{r, ok}, err
		}, func(q url.Values, x hashRange) {
			if x.ok {
				SetHashRange(q, x.r)
			}
		}, nil)
}

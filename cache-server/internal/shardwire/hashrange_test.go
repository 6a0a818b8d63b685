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
	f.Add("hashShards=0-7/16")
	f.Add("hashShards=3-3/4")
	f.Add("hashShards=1-0/2")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		r, ok, err := ParseHashRange(q)
		if err != nil {
			if !apierrors.IsBadRequest(err) {
				t.Fatalf("%q: %v is not a 400", raw, err)
			}
			return
		}
		if !ok {
			return
		}
		again := url.Values{}
		SetHashRange(again, r)
		if r2, ok2, err := ParseHashRange(again); err != nil || !ok2 || r2 != r {
			t.Fatalf("%q: %v, written and read back %v %v %v", raw, r, r2, ok2, err)
		}
	})
}

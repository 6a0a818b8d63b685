package shardwire

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// ParamHashShards is the query parameter of every shard request that says
// which hash shards the front expects the replica to hold, as
// "<first>-<last>/<total>" (HashRange.String).
//
// A shard's name does not say what it holds: when the shard count changes,
// a shard's replicas roll onto a new range one at a time while fronts of
// the old topology still run (and new fronts start before every shard
// rolled). A front reading a replica with another range would merge a
// stream and lists missing some objects' changes, or holding them twice,
// and would serve that as complete. With the range on every request, a
// replica that holds a different one refuses (StatusMisdirected) and the
// front tries the shard's other replicas instead.
const ParamHashShards = "hashShards"

// StatusMisdirected is a replica's answer to a request for hash shards it
// does not hold (HTTP 421 Misdirected Request: this server cannot answer
// for what the request is directed at; another one can).
const StatusMisdirected = 421

// HashRange is the hash shards First..Last (inclusive) of Total.
type HashRange struct{ First, Last, Total int }

func (r HashRange) String() string { return fmt.Sprintf("%d-%d/%d", r.First, r.Last, r.Total) }

// SetHashRange adds r to a shard request's query.
func SetHashRange(q url.Values, r HashRange) { q.Set(ParamHashShards, r.String()) }

// ParseHashRange reads what SetHashRange wrote; ok is false when the query
// has none (a caller that does not say: the replica answers with what it
// holds). A malformed or impossible range is a 400.
func ParseHashRange(q url.Values) (r HashRange, ok bool, err error) {
	vs, ok := q[ParamHashShards]
	if !ok {
		return HashRange{}, false, nil
	}
	bad := func(why string) (HashRange, bool, error) {
		return HashRange{}, false, apierrors.NewBadRequest(fmt.Sprintf("%s: %s", ParamHashShards, why))
	}
	if len(vs) != 1 {
		return bad(fmt.Sprintf("given %d times", len(vs)))
	}
	span, total, found := strings.Cut(vs[0], "/")
	if !found {
		return bad(fmt.Sprintf("%q is not <first>-<last>/<total>", vs[0]))
	}
	first, last, found := strings.Cut(span, "-")
	if !found {
		return bad(fmt.Sprintf("%q is not <first>-<last>/<total>", vs[0]))
	}
	nums := [3]int{}
	for i, s := range []string{first, last, total} {
		n, err := strconv.ParseUint(s, 10, 31)
		if err != nil {
			return bad(fmt.Sprintf("%q is not <first>-<last>/<total>", vs[0]))
		}
		nums[i] = int(n)
	}
	r = HashRange{First: nums[0], Last: nums[1], Total: nums[2]}
	if r.First > r.Last || r.Last >= r.Total {
		return bad(fmt.Sprintf("%q is not a range of hash shards", vs[0]))
	}
	return r, true, nil
}

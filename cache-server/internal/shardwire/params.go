package shardwire

import (
	"fmt"
	"net/url"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Query parameters of a list request (PathList) that carry the read's
// index: store.ListRequest.Index and ContinueByIndex. The field selector
// travels as text too; the index says which of its equalities the shard
// reads through, and the flag which continuation rule its page follows —
// both decided once, by the front (listparams.Request.ListIndex), so every
// shard answers by the same rule.
const (
	// ParamIndex is the indexed field.
	ParamIndex = "index"
	// ParamIndexValue is its value; present, possibly empty (pods without
	// a node), exactly when ParamIndex is.
	ParamIndexValue = "indexValue"
	// ParamContinueByIndex is "true" for the apiserver's index rule.
	ParamContinueByIndex = "continueByIndex"
)

// ParamContentHash asks a shard to send each list item's content hash
// (KindHashedObject); its value names the hash, ContentHashXXH64 — the
// only one, store.HashContent. A front keys the compressed chunks it keeps
// by its items' content, and the shard computed the hash once per change
// at ingestion, where the front would hash every item of every LIST. A
// shard that does not know the parameter sends plain object records and
// the front hashes them itself, so fronts and shards of different versions
// work together; a future hash gets a new value, never this one.
const (
	ParamContentHash = "contentHash"
	ContentHashXXH64 = "xxhash64"
)

// WantsContentHashes reports whether a list request's query asks for the
// items' content hashes in the hash this shard computes.
func WantsContentHashes(q url.Values) bool { return q.Get(ParamContentHash) == ContentHashXXH64 }

// SetIndex adds a read's index to a list request's query (nothing when
// iv.Field is "").
func SetIndex(q url.Values, iv store.IndexValue, continueByIndex bool) {
	if iv.Field == "" {
		return
	}
	q.Set(ParamIndex, iv.Field)
	q.Set(ParamIndexValue, iv.Value)
	if continueByIndex {
		q.Set(ParamContinueByIndex, "true")
	}
}

// ParseIndex reads what SetIndex wrote. A malformed combination (a value
// without a field, a field without a value, a repeated parameter, a flag
// that is not a boolean or comes without an index) is a 400.
func ParseIndex(q url.Values) (iv store.IndexValue, continueByIndex bool, err error) {
	for _, p := range []string{ParamIndex, ParamIndexValue, ParamContinueByIndex} {
		if len(q[p]) > 1 {
			return store.IndexValue{}, false, apierrors.NewBadRequest(fmt.Sprintf("%s given %d times", p, len(q[p])))
		}
	}
	field, hasField := q[ParamIndex]
	value, hasValue := q[ParamIndexValue]
	flag, hasFlag := q[ParamContinueByIndex]
	switch {
	case !hasField && !hasValue && !hasFlag:
		return store.IndexValue{}, false, nil
	case !hasField || field[0] == "":
		return store.IndexValue{}, false, apierrors.NewBadRequest(fmt.Sprintf("%s and %s need a non-empty %s", ParamIndexValue, ParamContinueByIndex, ParamIndex))
	case !hasValue:
		return store.IndexValue{}, false, apierrors.NewBadRequest(fmt.Sprintf("%s needs %s", ParamIndex, ParamIndexValue))
	}
	if hasFlag {
		if continueByIndex, err = strconv.ParseBool(flag[0]); err != nil {
			return store.IndexValue{}, false, apierrors.NewBadRequest(fmt.Sprintf("%s: %q is not a boolean", ParamContinueByIndex, flag[0]))
		}
	}
	return store.IndexValue{Field: field[0], Value: value[0]}, continueByIndex, nil
}

// ParamBulkNice marks a list request as part of a front's bulk request
// (bulkthread): its value is the nice value at which the front runs that
// request's work, and the shard runs its part as low when it can
// (shardserver). Shards run no priority and fairness of their own; the
// front, which does, decides what is bulk. A shard that does not know
// the parameter serves the list at its own priority.
const ParamBulkNice = "bulkNice"

// SetBulkNice adds a bulk request's nice value to a list request's query
// (nothing for 0: not bulk).
func SetBulkNice(q url.Values, nice int) {
	if nice != 0 {
		q.Set(ParamBulkNice, strconv.Itoa(nice))
	}
}

// ParseBulkNice reads what SetBulkNice wrote: 0 when absent, else a nice
// value from 1 to 19 (anything else is a 400: a front sends no other).
func ParseBulkNice(q url.Values) (int, error) {
	v, ok := q[ParamBulkNice]
	if !ok {
		return 0, nil
	}
	if len(v) == 1 {
		if n, err := strconv.Atoi(v[0]); err == nil && n >= 1 && n <= 19 {
			return n, nil
		}
	}
	return 0, apierrors.NewBadRequest(fmt.Sprintf("%s=%q: want one nice value from 1 to 19", ParamBulkNice, v))
}

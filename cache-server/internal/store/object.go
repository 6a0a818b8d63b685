// Package store keeps the encoded objects of one cached resource, split into
// hash shards, with copy-on-write snapshots per resourceVersion so that
// paginated LISTs can be served from the exact state a continue token names.
//
// Objects are kept as the bytes received from the apiserver plus the few
// attributes selectors need (labels, field-selector values); nothing is
// decoded on the read path.
package store

import (
	"fmt"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/google/btree"
	"k8s.io/apimachinery/pkg/fields"
)

// Object is one stored object. It is immutable once handed to the store:
// snapshots share *Object pointers, so mutating one would rewrite history.
type Object struct {
	// Key is keyhash.Key(Namespace, Name); the store orders and shards by it.
	Key       string
	Namespace string
	Name      string
	// RV is the object's metadata.resourceVersion.
	RV     uint64
	Labels map[string]string
	// Fields holds the object's field-selector values other than
	// metadata.name and metadata.namespace (see package fields and
	// FieldSet); nil when the resource has none.
	Fields map[string]string
	// Raw is the JSON encoding as received from the apiserver.
	Raw []byte
	// Seq names this state of this object within its Store: set when the
	// object is handed to the Store (Apply, Replace) and never reused
	// there, so equal Seqs from one Store mean equal bytes; 0 for objects
	// that did not come through a Store. Encoders key work they keep for
	// later requests by it (package gzipchunks).
	Seq uint64
	// ContentHash is HashContent(Raw) when whoever built the object
	// computed it (a shard's ingestion does, once per change; a front
	// reading a shard that sent it), else 0. A fleet's front keys the compressed
	// chunks it keeps by its items' content (gzipchunks.Stream); with the
	// hash sent along by the shards it does not hash every item's bytes
	// again on every LIST, which was 12–14% of a front's CPU under a
	// flood of full LISTs.
	ContentHash uint64
}

// HashContent is a 64-bit hash (xxhash) of an object's stored bytes,
// never 0 (0 marks an object whose hash was not computed). Equal bytes
// hash equal in every process and after every restart, so a hash computed
// by a shard names the same object state at its fronts.
func HashContent(raw []byte) uint64 { return xxhash.Sum64(raw) | 1 }

// FieldSet is what field selectors match the object against: Fields plus
// metadata.name and, for namespaced objects, metadata.namespace (the
// apiserver's DefaultNamespaceScopedAttr / DefaultClusterScopedAttr).
func (o *Object) FieldSet() fields.Fields { return objectFields{o} }

type objectFields struct{ o *Object }

func (f objectFields) Has(field string) bool {
	switch field {
	case "metadata.name":
		return true
	case "metadata.namespace":
		return f.o.Namespace != ""
	}
	_, ok := f.o.Fields[field]
	return ok
}

func (f objectFields) Get(field string) string {
	switch field {
	case "metadata.name":
		return f.o.Name
	case "metadata.namespace":
		return f.o.Namespace
	}
	return f.o.Fields[field]
}

// EventType is the kind of change an Event carries.
type EventType int

const (
	Added EventType = iota + 1
	Modified
	Deleted
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "ADDED"
	case Modified:
		return "MODIFIED"
	case Deleted:
		return "DELETED"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change from the upstream stream. RV is the resourceVersion the
// change happened at; for Deleted, Object is the last state of the object
// (only its Key is needed to apply it).
type Event struct {
	Type   EventType
	Object *Object
	RV     uint64
	// Prev is the state before the change, when the producer knows it (a
	// fleet's front gets it from the shard that owns the key); nil
	// otherwise, and always nil for events applied to a Store.
	Prev *Object
}

// btreeDegree trades node size against depth; 32 is what the apiserver's
// watch cache uses and keeps a 1M-object tree four levels deep.
const btreeDegree = 32

func lessByKey(a, b *Object) bool { return a.Key < b.Key }

func newTree() *btree.BTreeG[*Object] { return btree.NewG(btreeDegree, lessByKey) }

// Snapshot is an immutable view of a shard at one resourceVersion. It is a
// cheap value (a B-tree clone shares nodes with the live tree) and is safe to
// read from any goroutine while the shard keeps applying events.
type Snapshot struct {
	tree *btree.BTreeG[*Object]
	rv   uint64
	// fields are the indexed fields; index[i] is fields[i]'s index in the
	// same state as tree (see index.go).
	fields []string
	index  []*indexTree
}

// RV is the resourceVersion this snapshot represents.
func (s Snapshot) RV() uint64 { return s.rv }

// Len is the number of objects in the snapshot.
func (s Snapshot) Len() int {
	if s.tree == nil {
		return 0
	}
	return s.tree.Len()
}

// Get returns the object stored under key.
func (s Snapshot) Get(key string) (*Object, bool) {
	if s.tree == nil {
		return nil, false
	}
	return s.tree.Get(&Object{Key: key})
}

// Range calls fn, in key order, for every object whose key has the given
// prefix and sorts strictly after startKeyExclusive ("" = from the start of
// the prefix), until fn returns false.
func (s Snapshot) Range(prefix, startKeyExclusive string, fn func(*Object) bool) {
	if s.tree == nil {
		return
	}
	s.tree.AscendGreaterOrEqual(&Object{Key: rangeStart(prefix, startKeyExclusive)}, func(o *Object) bool {
		if !strings.HasPrefix(o.Key, prefix) {
			return false
		}
		return fn(o)
	})
}

// rangeStart is the smallest key a range scan may return. Appending "\x00"
// gives the smallest string greater than the key, the same trick the
// apiserver uses for continue keys, so the scan starts strictly after it.
func rangeStart(prefix, startKeyExclusive string) string {
	if startKeyExclusive == "" {
		return prefix
	}
	after := startKeyExclusive + "\x00"
	if after < prefix {
		return prefix
	}
	return after
}

// Last returns the greatest key with the given prefix ("" = any).
func (s Snapshot) Last(prefix string) (string, bool) {
	if s.tree == nil {
		return "", false
	}
	if prefix == "" {
		o, ok := s.tree.Max()
		if !ok {
			return "", false
		}
		return o.Key, true
	}
	end := prefixEnd(prefix)
	var key string
	s.tree.DescendLessOrEqual(&Object{Key: end}, func(o *Object) bool {
		if o.Key >= end {
			return true
		}
		if strings.HasPrefix(o.Key, prefix) {
			key = o.Key
		}
		return false
	})
	return key, key != ""
}

// prefixEnd is the smallest string above every key with the (non-empty)
// prefix: the prefix with its last byte incremented (namespace prefixes
// end in '/').
func prefixEnd(prefix string) string {
	return prefix[:len(prefix)-1] + string([]byte{prefix[len(prefix)-1] + 1})
}

// Package keyhash defines the object key used everywhere in the cache tier and
// the hash that places a key on a hash shard.
//
// The key is the etcd key kube-apiserver stores the object under with the
// resource prefix removed: etcd holds "<prefix>/<namespace>/<name>" for
// namespaced objects and "<prefix>/<name>" for cluster-scoped ones, and a
// LIST returns items in etcd's byte order of those keys (the watch cache keeps
// the same order in its B-tree). Dropping the common prefix keeps that order
// byte for byte, so merging shards by Key yields exactly the apiserver's order
// and continue tokens can point into it.
package keyhash

import (
	"github.com/cespare/xxhash/v2"
)

// Key returns "namespace/name", or "name" when namespace is empty
// (cluster-scoped objects).
func Key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// NamespacePrefix returns the key prefix that selects every object of one
// namespace ("namespace/"), or "" for all namespaces. The trailing slash is
// what keeps namespace "a" from matching keys of namespace "a-b".
func NamespacePrefix(namespace string) string {
	if namespace == "" {
		return ""
	}
	return namespace + "/"
}

// Shard returns the hash shard of key in [0, shards). It hashes the whole key
// (namespace included) so that one big namespace spreads over all shards.
// shards must be positive; a non-positive count is a configuration bug and
// panics rather than silently routing everything to one place.
func Shard(key string, shards int) int {
	if shards <= 0 {
		panic("keyhash: shard count must be positive")
	}
	return int(xxhash.Sum64String(key) % uint64(shards))
}

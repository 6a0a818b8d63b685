package keyhash

import (
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestKey(t *testing.T) {
	cases := []struct{ ns, name, want string }{
		{"default", "web-0", "default/web-0"},
		{"", "node-1", "node-1"},
		{"kube-system", "a", "kube-system/a"},
	}
	for _, c := range cases {
		if got := Key(c.ns, c.name); got != c.want {
			t.Errorf("Key(%q,%q) = %q, want %q", c.ns, c.name, got, c.want)
		}
	}
}

// TestKeyOrderMatchesEtcd checks that sorting our keys gives the same order as
// sorting the etcd keys kube-apiserver would store the objects under; the
// tricky cases are namespaces that are prefixes of one another, where '-'
// (0x2d) and '.' (0x2e) sort before '/' (0x2f).
func TestKeyOrderMatchesEtcd(t *testing.T) {
	type obj struct{ ns, name string }
	objs := []obj{
		{"a", "z"}, {"a-b", "a"}, {"a.b", "c"}, {"a", "a"}, {"ab", "0"},
		{"a", "a-1"}, {"a", "a.1"}, {"b", "x"}, {"a", "a0"},
	}
	etcd := func(o obj) string { return "/registry/pods/" + o.ns + "/" + o.name }
	byEtcd := slices.Clone(objs)
	sort.Slice(byEtcd, func(i, j int) bool { return etcd(byEtcd[i]) < etcd(byEtcd[j]) })
	byKey := slices.Clone(objs)
	sort.Slice(byKey, func(i, j int) bool { return Key(byKey[i].ns, byKey[i].name) < Key(byKey[j].ns, byKey[j].name) })
	if !slices.Equal(byEtcd, byKey) {
		t.Fatalf("order differs:\netcd: %v\nkeys: %v", byEtcd, byKey)
	}
	// "a-b/a" must come before "a/a": the etcd order interleaves namespaces
	// that share a prefix, so a namespace scan must use the "a/" prefix.
	if byKey[0] != (obj{"a-b", "a"}) {
		t.Fatalf("first = %v", byKey[0])
	}
}

func TestNamespacePrefix(t *testing.T) {
	if NamespacePrefix("") != "" || NamespacePrefix("a") != "a/" {
		t.Fatal("NamespacePrefix")
	}
}

func TestShard(t *testing.T) {
	const n = 16
	counts := make([]int, n)
	for i := range 16000 {
		k := Key("ns", "obj-"+strconv.Itoa(i))
		s := Shard(k, n)
		if s < 0 || s >= n {
			t.Fatalf("Shard out of range: %d", s)
		}
		if s != int(xxhash.Sum64String(k)%n) {
			t.Fatalf("Shard(%q) is not xxhash64 mod n", k)
		}
		if Shard(k, n) != s {
			t.Fatal("Shard not deterministic")
		}
		counts[s]++
	}
	for i, c := range counts {
		if c < 800 || c > 1200 {
			t.Errorf("shard %d got %d of 16000 keys: badly unbalanced", i, c)
		}
	}
	// A single-shard tier routes everything to shard 0.
	if Shard("x", 1) != 0 {
		t.Fatal("Shard(x,1)")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Shard with 0 shards must panic")
		}
	}()
	Shard("x", 0)
}

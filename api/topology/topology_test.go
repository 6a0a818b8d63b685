package topology

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func good() *Topology {
	return &Topology{HashShards: 8, Shards: []Shard{
		{Name: "a", FirstHashShard: 0, LastHashShard: 2, Replicas: 2, Endpoints: []string{"a-0:8443", "a-1:8443"}},
		{Name: "b", FirstHashShard: 3, LastHashShard: 3, Replicas: 1, Endpoints: []string{"b-0:8443"}},
		{Name: "c", FirstHashShard: 4, LastHashShard: 7, Replicas: 1, Endpoints: []string{"c-0:8443"}},
	}}
}

func TestValidateAccepts(t *testing.T) {
	cases := map[string]*Topology{
		"three shards": good(),
		"one shard":    {HashShards: 1, Shards: []Shard{{Name: "only", FirstHashShard: 0, LastHashShard: 0, Endpoints: []string{"x:1"}}}},
		"unordered": {HashShards: 4, Shards: []Shard{
			{Name: "hi", FirstHashShard: 2, LastHashShard: 3, Endpoints: []string{"hi:1"}},
			{Name: "lo", FirstHashShard: 0, LastHashShard: 1, Endpoints: []string{"lo:1"}},
		}},
	}
	for name, topo := range cases {
		if err := topo.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestValidateRefuses(t *testing.T) {
	cases := map[string]struct {
		edit func(*Topology)
		want string
	}{
		"no hash shards":       {func(t *Topology) { t.HashShards = 0 }, "hashShards must be at least 1"},
		"negative hash shards": {func(t *Topology) { t.HashShards = -3 }, "hashShards must be at least 1"},
		"hole in the middle":   {func(t *Topology) { t.Shards = append(t.Shards[:1], t.Shards[2:]...) }, "hash shard 3 is served by no shard"},
		"hole at the end":      {func(t *Topology) { t.Shards[2].LastHashShard = 6 }, "hash shard 7 is served by no shard"},
		"hole at the start":    {func(t *Topology) { t.Shards[0].FirstHashShard = 1 }, "hash shard 0 is served by no shard"},
		"no shards":            {func(t *Topology) { t.Shards = nil }, "served by no shard"},
		"overlap":              {func(t *Topology) { t.Shards[1].FirstHashShard = 2 }, "hash shard 2 is served by both a and b"},
		"duplicate shard":      {func(t *Topology) { t.Shards = append(t.Shards, t.Shards[2]) }, "shard name c is used twice"},
		"first below zero":     {func(t *Topology) { t.Shards[0].FirstHashShard = -1 }, "shard a: hash shards -1-2 outside 0-7"},
		"last beyond the end":  {func(t *Topology) { t.Shards[2].LastHashShard = 8 }, "shard c: hash shards 4-8 outside 0-7"},
		"reversed range":       {func(t *Topology) { t.Shards[2].FirstHashShard, t.Shards[2].LastHashShard = 7, 4 }, "shard c"},
		"hash shards shrunk":   {func(t *Topology) { t.HashShards = 4 }, "outside 0-3"},
		"no endpoints":         {func(t *Topology) { t.Shards[1].Endpoints = nil }, "shard b has no endpoints"},
		"empty endpoints":      {func(t *Topology) { t.Shards[1].Endpoints = []string{} }, "no endpoints"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			topo := good()
			c.edit(topo)
			err := topo.Validate()
			if err == nil {
				t.Fatalf("accepted %+v", topo)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

// Validate tracks owners by name, so a shard without a name owns nothing:
// a second shard over its range is not an overlap.
func TestValidateRefusesOverlapWithUnnamedShard(t *testing.T) {
	topo := &Topology{HashShards: 4, Shards: []Shard{
		{Name: "", FirstHashShard: 0, LastHashShard: 3, Endpoints: []string{"x:1"}},
		{Name: "b", FirstHashShard: 0, LastHashShard: 3, Endpoints: []string{"b:1"}},
	}}
	if err := topo.Validate(); err == nil {
		t.Fatal("accepted two shards serving the same hash shards")
	}
}

func TestShardOf(t *testing.T) {
	topo := good()
	want := []int{0, 0, 0, 1, 2, 2, 2, 2}
	for h, w := range want {
		if got := topo.ShardOf(h); got != w {
			t.Errorf("ShardOf(%d) = %d, want %d", h, got, w)
		}
	}
	for _, h := range []int{-1, 8, 100} {
		if got := topo.ShardOf(h); got != -1 {
			t.Errorf("ShardOf(%d) = %d, want -1", h, got)
		}
	}
	// Order of Shards does not matter: the index is the position in it.
	rev := &Topology{HashShards: 8, Shards: []Shard{topo.Shards[2], topo.Shards[0], topo.Shards[1]}}
	for h, w := range []int{1, 1, 1, 2, 0, 0, 0, 0} {
		if got := rev.ShardOf(h); got != w {
			t.Errorf("reordered: ShardOf(%d) = %d, want %d", h, got, w)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("good.yaml", `
hashShards: 4
shards:
- name: a
  firstHashShard: 0
  lastHashShard: 1
  replicas: 1
  endpoints: ["a-0.a:8443"]
- name: b
  firstHashShard: 2
  lastHashShard: 3
  replicas: 2
  endpoints: ["b-0.b:8443", "b-1.b:8443"]
`)
	topo, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if topo.HashShards != 4 || len(topo.Shards) != 2 || topo.Shards[1].Name != "b" || len(topo.Shards[1].Endpoints) != 2 || topo.ShardOf(3) != 1 {
		t.Fatalf("loaded %+v", topo)
	}

	for name, c := range map[string]struct{ content, want string }{
		"unknown field": {"hashShards: 1\nshard: []\n", "unknown field"},
		"invalid":       {"hashShards: 2\nshards:\n- name: a\n  firstHashShard: 0\n  lastHashShard: 0\n  endpoints: [x]\n", "hash shard 1 is served by no shard"},
		"not yaml":      {"hashShards: [", "topology"},
	} {
		_, err := Load(write(name+".yaml", c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), name+".yaml") {
			t.Errorf("%s: got %v, want an error naming the file and containing %q", name, err, c.want)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}

// Assign covers every hash shard once, in contiguous ranges whose sizes
// differ by at most one, the larger ones first; the result validates.
func TestAssign(t *testing.T) {
	for h := int32(1); h <= 20; h++ {
		for s := int32(1); s <= h; s++ {
			ranges := Assign(h, s)
			topo := Topology{HashShards: h}
			var next int32
			for i, r := range ranges {
				size := r.Last - r.First + 1
				if r.First != next || size < h/s || size > h/s+1 || (size == h/s+1) != (int32(i) < h%s) {
					t.Fatalf("Assign(%d, %d) = %v", h, s, ranges)
				}
				next = r.Last + 1
				topo.Shards = append(topo.Shards, Shard{Name: fmt.Sprint(i), FirstHashShard: r.First, LastHashShard: r.Last, Endpoints: []string{"x:1"}})
			}
			if err := topo.Validate(); err != nil || next != h {
				t.Fatalf("Assign(%d, %d) = %v: %v", h, s, ranges, err)
			}
		}
	}
}

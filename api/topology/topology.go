// Package topology is the fleet layout the operator renders for a profile's
// fronts (topology.yaml in the fleet's ConfigMap) and the cache-server's
// front role reads: which hash shards each shard serves and where its
// replicas answer. One definition for both sides.
package topology

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// Topology is a fleet's layout.
type Topology struct {
	HashShards int32   `json:"hashShards"`
	Shards     []Shard `json:"shards"`
}

// Shard is one shard: a contiguous range of hash shards and its replicas.
type Shard struct {
	Name           string   `json:"name"`
	FirstHashShard int32    `json:"firstHashShard"`
	LastHashShard  int32    `json:"lastHashShard"`
	Replicas       int32    `json:"replicas"`
	Endpoints      []string `json:"endpoints"`
}

// Load reads and validates a topology file.
func Load(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Topology
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("topology %s: %w", path, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("topology %s: %w", path, err)
	}
	return &t, nil
}

// Validate checks that the shards cover every hash shard exactly once and
// each has an endpoint: a front serving a fleet with a hole would answer
// incomplete lists.
func (t *Topology) Validate() error {
	if t.HashShards < 1 {
		return fmt.Errorf("hashShards must be at least 1, got %d", t.HashShards)
	}
	owner := make([]string, t.HashShards)
	names := map[string]bool{}
	for _, s := range t.Shards {
		if s.Name == "" {
			return fmt.Errorf("a shard has no name")
		}
		if names[s.Name] {
			return fmt.Errorf("shard name %s is used twice", s.Name)
		}
		names[s.Name] = true
		if s.FirstHashShard < 0 || s.LastHashShard >= t.HashShards || s.FirstHashShard > s.LastHashShard {
			return fmt.Errorf("shard %s: hash shards %d-%d outside 0-%d", s.Name, s.FirstHashShard, s.LastHashShard, t.HashShards-1)
		}
		if len(s.Endpoints) == 0 {
			return fmt.Errorf("shard %s has no endpoints", s.Name)
		}
		for h := s.FirstHashShard; h <= s.LastHashShard; h++ {
			if owner[h] != "" {
				return fmt.Errorf("hash shard %d is served by both %s and %s", h, owner[h], s.Name)
			}
			owner[h] = s.Name
		}
	}
	for h, o := range owner {
		if o == "" {
			return fmt.Errorf("hash shard %d is served by no shard", h)
		}
	}
	return nil
}

// ShardOf is the index in Shards of the shard serving hash shard h.
func (t *Topology) ShardOf(h int) int {
	for i, s := range t.Shards {
		if int32(h) >= s.FirstHashShard && int32(h) <= s.LastHashShard {
			return i
		}
	}
	return -1
}

// Range is one shard's contiguous hash shards, inclusive.
type Range struct{ First, Last int32 }

// Assign places hashShards hash shards on shards shards in contiguous
// ranges whose sizes differ by at most one (the first hashShards%shards get
// one more): the operator's assignment, which every fleet follows.
func Assign(hashShards, shards int32) []Range {
	out := make([]Range, 0, shards)
	var next int32
	for i := int32(0); i < shards; i++ {
		size := hashShards / shards
		if i < hashShards%shards {
			size++
		}
		out = append(out, Range{First: next, Last: next + size - 1})
		next += size
	}
	return out
}

package store

// Counts of a shard's latest state that a read's cost is estimated from
// (the tier's priority-and-fairness work estimator): a LIST of one
// namespace walks only that namespace's key range, and a LIST that pins an
// indexed field's value walks only that value's run of the index, so
// their cost is those objects, not the resource's. Kept by the writer as
// it applies changes (a map update per changed object), read in O(1) per
// shard; not kept per resourceVersion — an estimate needs the present.

// counts are one shard's objects per namespace and per value of each
// indexed field (in the order of Shard.fields).
type counts struct {
	namespaces map[string]int
	values     []map[string]int
}

func newCounts(fields int) counts {
	c := counts{namespaces: map[string]int{}, values: make([]map[string]int, fields)}
	for i := range c.values {
		c.values[i] = map[string]int{}
	}
	return c
}

// move accounts for an object going from old (nil: absent) to cur (nil:
// deleted).
func (c counts) move(fields []string, old, cur *Object) {
	if old != nil {
		dec(c.namespaces, old.Namespace)
	}
	if cur != nil {
		c.namespaces[cur.Namespace]++
	}
	for i, f := range fields {
		if old != nil {
			dec(c.values[i], indexValue(old, f))
		}
		if cur != nil {
			c.values[i][indexValue(cur, f)]++
		}
	}
}

// dec decrements k, deleting it at zero so the maps hold only what exists
// (their sizes are the distinct namespaces and values).
func dec(m map[string]int, k string) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}

// Sizes are the numbers a read's cost is estimated from.
type Sizes struct {
	// Objects and Bytes of the whole resource.
	Objects int64
	Bytes   int64
	// Namespaces is the number of distinct namespaces with objects (0 for
	// a cluster-scoped resource). Over a fleet it is the largest count of
	// one shard (a namespace spans shards), a lower bound.
	Namespaces int
	// Values is, per indexed field, its number of distinct values (the
	// same lower bound over a fleet).
	Values map[string]int
}

// Count is the number of objects a read of namespace ns (""= all),
// restricted to iv when iv.Field is set, walks, and their bytes
// (estimated at the resource's average size): the objects of iv's value
// in ns when the store indexes iv.Field, else those of ns.
func (s *Store) Count(ns string, iv IndexValue) (objects, bytes int64) {
	var total, all int64
	for _, sh := range s.shards {
		n, t, b := sh.count(ns, iv)
		objects += n
		total += t
		all += b
	}
	if total > 0 {
		bytes = all * objects / total
	}
	return objects, bytes
}

// Sizes returns the resource's sizes over all shards.
func (s *Store) Sizes() Sizes {
	out := Sizes{Values: map[string]int{}}
	for _, sh := range s.shards {
		st := sh.sizes()
		out.Objects += st.Objects
		out.Bytes += st.Bytes
		out.Namespaces = max(out.Namespaces, st.Namespaces)
		for f, v := range st.Values {
			out.Values[f] = max(out.Values[f], v)
		}
	}
	return out
}

// count is the shard's share of Store.Count: the objects walked, the
// shard's object count and its bytes.
func (s *Shard) count(ns string, iv IndexValue) (walked, total, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	total, bytes = int64(s.tree.Len()), s.bytes
	walked = total
	if ns != "" {
		walked = int64(s.counts.namespaces[ns])
	}
	if iv.Field == "" {
		return walked, total, bytes
	}
	for i, f := range s.fields {
		if f == iv.Field {
			// The index's run of the value spans namespaces; a read of
			// one namespace walks the part of it in that namespace, at
			// most the smaller of the two.
			walked = min(walked, int64(s.counts.values[i][iv.Value]))
			break
		}
	}
	return walked, total, bytes
}

func (s *Shard) sizes() Sizes {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Sizes{Objects: int64(s.tree.Len()), Bytes: s.bytes, Namespaces: len(s.counts.namespaces), Values: map[string]int{}}
	if len(s.counts.namespaces) == 1 {
		if _, clusterScoped := s.counts.namespaces[""]; clusterScoped {
			out.Namespaces = 0
		}
	}
	for i, f := range s.fields {
		out.Values[f] = len(s.counts.values[i])
	}
	return out
}

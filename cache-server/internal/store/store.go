package store

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
)

// Options configures a Store.
type Options struct {
	// Shards is the number of hash shards (keyhash.Shard). Must be positive.
	Shards        int
	HistoryWindow time.Duration
	MaxHistory    int
	Clock         clock.PassiveClock
	// Indexes are the fields every shard keeps an index of, at every
	// state it serves (catalog.Entry.FieldIndexes): a read that pins one
	// of them to a value (ListRequest.Index) visits only the objects with
	// that value.
	Indexes []string
}

// Store is one cached resource: N hash shards fed from one upstream stream.
type Store struct {
	// mu makes a write (an event and the progress it implies for every other
	// shard) atomic with respect to List/Get at the latest RV, so an
	// in-process reader always sees all shards at the same RV without
	// needing history for it.
	mu     sync.RWMutex
	shards []*Shard
	// seq is the last Object.Seq handed out (under mu).
	seq uint64
	// batches holds the merge cursors' batch buffers (*[]*Object of
	// capacity maxBatch) between reads; see cursor.
	batches sync.Pool
}

// New returns an empty store.
func New(opts Options) (*Store, error) {
	if opts.Shards <= 0 {
		return nil, fmt.Errorf("store: shard count must be positive, got %d", opts.Shards)
	}
	s := &Store{shards: make([]*Shard, opts.Shards)}
	for i := range s.shards {
		s.shards[i] = NewShard(ShardOptions{HistoryWindow: opts.HistoryWindow, MaxHistory: opts.MaxHistory, Clock: opts.Clock, Indexes: opts.Indexes})
	}
	return s, nil
}

// Shards exposes the shards for reading (snapshots, progress, stats). Write
// through the Store: writing to a shard directly bypasses the cross-shard
// progress that keeps all shards at the same RV.
func (s *Store) Shards() []*Shard { return s.shards }

// ShardFor returns the index of the shard owning key.
func (s *Store) ShardFor(key string) int { return keyhash.Shard(key, len(s.shards)) }

// Apply routes ev to the shard owning its key and marks every other shard as
// having seen ev.RV (each shard sees every upstream RV).
func (s *Store) Apply(ev Event) error {
	if ev.Object == nil {
		return fmt.Errorf("store: %s event at RV %d has no object", ev.Type, ev.RV)
	}
	owner := s.ShardFor(ev.Object.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.number(ev.Object)
	if err := s.shards[owner].Apply(ev); err != nil {
		return err
	}
	for i, sh := range s.shards {
		if i != owner {
			sh.MarkProgress(ev.RV)
		}
	}
	return nil
}

// number gives o its Seq unless it has one (an object already stored,
// handed in again, keeps it: readers may be looking at it). Objects come
// from this Store's ingester, never from another Store, so a Seq found
// here is this Store's own. Called under s.mu, before o is reachable by
// readers.
func (s *Store) number(o *Object) {
	if o.Seq == 0 {
		s.seq++
		o.Seq = s.seq
	}
}

// MarkProgress records upstream progress (a bookmark) on every shard.
func (s *Store) MarkProgress(rv uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range s.shards {
		sh.MarkProgress(rv)
	}
}

// Replace relists the whole resource at rv (see Shard.Replace) and returns
// the difference as events in key order.
func (s *Store) Replace(objects []*Object, rv uint64) ([]Event, error) {
	// Reject a broken input before touching any shard, so a failed
	// Replace never leaves some shards relisted and others not.
	seen := make(map[string]struct{}, len(objects))
	parts := make([][]*Object, len(s.shards))
	for _, o := range objects {
		if _, dup := seen[o.Key]; dup {
			return nil, fmt.Errorf("store: Replace got key %q twice", o.Key)
		}
		seen[o.Key] = struct{}{}
		i := s.ShardFor(o.Key)
		parts[i] = append(parts[i], o)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range s.shards {
		if a := sh.AppliedRV(); rv < a {
			return nil, fmt.Errorf("%w: replace at RV %d, applied %d", ErrStaleEvent, rv, a)
		}
	}
	for _, o := range objects {
		s.number(o)
	}
	var events []Event
	for i, sh := range s.shards {
		evs, err := sh.Replace(parts[i], rv)
		if err != nil {
			// Unreachable: keys and RVs were checked above under the lock.
			return nil, err
		}
		events = append(events, evs...)
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].Object.Key < events[j].Object.Key })
	return events, nil
}

// AppliedRV is the resourceVersion every shard has reached.
func (s *Store) AppliedRV() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.minAppliedLocked()
}

func (s *Store) minAppliedLocked() uint64 {
	m := s.shards[0].AppliedRV()
	for _, sh := range s.shards[1:] {
		m = min(m, sh.AppliedRV())
	}
	return m
}

// WaitForRV blocks until every shard has applied rv (or ctx ends, returning
// *TooLargeResourceVersionError).
func (s *Store) WaitForRV(ctx context.Context, rv uint64) error {
	for _, sh := range s.shards {
		if err := sh.WaitForRV(ctx, rv); err != nil {
			var tl *TooLargeResourceVersionError
			if errors.As(err, &tl) {
				tl.Current = s.AppliedRV()
			}
			return err
		}
	}
	return nil
}

// snapshots returns one snapshot per shard, all at the same RV: rv, or the
// store's applied RV when rv is 0.
func (s *Store) snapshots(rv uint64) ([]Snapshot, uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if rv == 0 {
		rv = s.minAppliedLocked()
	}
	snaps := make([]Snapshot, len(s.shards))
	for i, sh := range s.shards {
		snap, err := sh.Snapshot(rv)
		if err != nil {
			var tl *TooLargeResourceVersionError
			if errors.As(err, &tl) {
				tl.Current = s.minAppliedLocked()
			}
			return nil, 0, err
		}
		snaps[i] = snap
	}
	return snaps, rv, nil
}

// Get returns the object stored under key at snapshotRV (0 = latest).
func (s *Store) Get(key string, snapshotRV uint64) (*Object, uint64, error) {
	s.mu.RLock()
	sh := s.shards[s.ShardFor(key)]
	var snap Snapshot
	var err error
	if snapshotRV == 0 {
		snap = sh.Latest()
	} else {
		snap, err = sh.Snapshot(snapshotRV)
	}
	s.mu.RUnlock()
	if err != nil {
		return nil, 0, err
	}
	o, _ := snap.Get(key)
	return o, snap.RV(), nil
}

// ListRequest selects a page of a LIST.
type ListRequest struct {
	// SnapshotRV is the state to read; 0 = the latest applied state.
	SnapshotRV uint64
	// Namespace restricts to one namespace; "" = all (or cluster-scoped).
	Namespace string
	// StartKeyExclusive resumes after this key (from a continue token).
	StartKeyExclusive string
	// RemainingAfterStart, when known, is the number of items after
	// StartKeyExclusive in the range at SnapshotRV (the previous page's
	// RemainingItemCount). With Match nil the page's RemainingItemCount is
	// then a subtraction instead of a walk over the rest of the range.
	RemainingAfterStart *int64
	// Limit is the maximum number of items returned; <= 0 = no limit.
	Limit int64
	// Match is the label/field selector; nil matches everything. Whether it
	// is nil also decides RemainingItemCount, as in the apiserver: an exact
	// count is only given for an unfiltered list.
	Match func(*Object) bool
	// Index, when its Field is set, restricts the read to the objects
	// whose field has Index.Value — Match must require that too (it is
	// the field selector's equality, listparams.Request.IndexValue). The
	// read walks the store's index of the field, or filters the key range
	// when the store keeps none. Items and order are those of the same
	// read without Index; only the continuation may differ, see
	// ContinueByIndex. An indexed read is a filtered one: it never counts
	// RemainingItemCount.
	Index IndexValue
	// ContinueByIndex: kube-apiserver would read this page from its own
	// index of Index.Field (its watch cache's GetByIndexSnapshot), so, as
	// there, a full page continues only when an object with Index.Value
	// follows its last item in the range. Otherwise a full page continues
	// when any object of the range follows it (ListResult.ContinueKey).
	// Decided by listparams.Request.ListIndex; ignored without Index.
	ContinueByIndex bool
	// Selector is Match as text, for a reader that evaluates it in
	// another process (a fleet's shards); empty when Match is nil.
	Selector Selector
	// SkipCount leaves RemainingItemCount unset: the caller knows the
	// count (a fleet's front holding a continue token's count) and the
	// walk over the rest of the range would be wasted.
	SkipCount bool
	// Transient: a Scan's fn reads only each object's Raw and RV, and
	// only during its call, so a reader whose objects are not stored (a
	// fleet's front, reading the shards' streams) may pass one object
	// pointing into its read buffer instead of a copy of each (a
	// watch-list of 10k ConfigMaps copied 10 MiB per request). Readers
	// of stored objects ignore it.
	Transient bool
	// BulkNice is the nice value at which the read's request runs its
	// work (package bulkthread; 0: at the process's own). A reader in
	// another process (a fleet's shards) is asked to run its part as
	// low; a reader in this one runs on the caller's thread already.
	BulkNice int
}

// IndexValue names an indexed field and the value a request's field
// selector requires of it (an equality: "=" or "=="): a reader may then
// visit only the objects with that value. Field "" is no index.
type IndexValue struct {
	Field, Value string
}

// Selector is a label and a field selector in their canonical text form
// (field labels already converted for the resource).
type Selector struct {
	Label, Field string
}

// ListResult is one page.
type ListResult struct {
	// Items are in key order; never nil.
	Items []*Object
	// RV is the snapshot's resourceVersion (ListMeta.resourceVersion and the
	// RV to put in the continue token).
	RV uint64
	// ContinueKey is the key of the last returned item when more items may
	// remain, "" otherwise. As in the apiserver's cacher, with a selector it
	// is set whenever unscanned items remain, even if none of them match:
	// any item of the range, or with ContinueByIndex any item with the
	// index's value.
	ContinueKey string
	// RemainingItemCount is the number of items after this page, set only
	// when there is a next page and Match is nil.
	RemainingItemCount *int64
}

// List reads a page from per-shard snapshots at one RV, merging shards by
// key. It mirrors kube-apiserver's cacher GetList
// (k8s.io/apiserver/pkg/storage/cacher/cacher.go): with a selector it scans
// until it has Limit matching items, and there is a next page when any item
// (matching or not) follows the last scanned one — with ContinueByIndex,
// any item with the index's value, as the apiserver's read of its index.
func (s *Store) List(req ListRequest) (ListResult, error) {
	snaps, rv, err := s.snapshots(req.SnapshotRV)
	if err != nil {
		return ListResult{}, err
	}
	prefix := keyhash.NamespacePrefix(req.Namespace)
	m := newMerger(&s.batches, snaps, prefix, req.StartKeyExclusive, req.Limit, req.Index)
	defer m.release()

	res := ListResult{Items: make([]*Object, 0, itemsCapacity(snaps, prefix, req)), RV: rv}
	var lastSelected string
	hasMore := false
	for {
		o := m.next()
		if o == nil {
			break
		}
		if req.Match == nil || req.Match(o) {
			res.Items = append(res.Items, o)
			lastSelected = o.Key
		}
		if req.Limit > 0 && int64(len(res.Items)) >= req.Limit {
			hasMore = m.peek() != nil
			if req.Index.Field != "" && !req.ContinueByIndex {
				// The merge saw only the index's value; the rule
				// asks about any object of the range.
				hasMore = anyAfter(snaps, prefix, lastSelected)
			}
			break
		}
	}
	if hasMore {
		res.ContinueKey = lastSelected
		if req.Match == nil && req.Index.Field == "" && !req.SkipCount {
			n := int64(-1)
			if req.RemainingAfterStart != nil {
				n = *req.RemainingAfterStart - int64(len(res.Items))
			}
			if n < 0 {
				// Unknown, or a count that cannot be right (every item
				// after the start is returned or remains).
				n = m.countRest()
			}
			res.RemainingItemCount = &n
		}
	}
	return res, nil
}

// itemsCapacity is what a List's result is sized to from the start. Grown
// by appends, a full LIST of 10,000 objects allocated about five times its
// final 80 KB; under a flood of full LISTs that was most of what a
// standalone tier allocated, and its collector ran five times a second
// (docs/benchmarks.md "Floods"). A page holds at most Limit items, an
// unfiltered cluster-wide read every item; a filtered or namespaced read
// without a limit may return few of them, so it grows as it goes.
func itemsCapacity(snaps []Snapshot, prefix string, req ListRequest) int {
	n := 0
	for _, sn := range snaps {
		n += sn.Len()
	}
	switch {
	case req.Limit > 0:
		return int(min(int64(n), req.Limit))
	case req.Match == nil && req.Index.Field == "" && prefix == "":
		return n
	default:
		return 0
	}
}

// anyAfter reports whether any shard holds a key of the range after key:
// one descent per shard, never a scan.
func anyAfter(snaps []Snapshot, prefix, key string) bool {
	for _, sn := range snaps {
		if sn.hasAfter(prefix, key) {
			return true
		}
	}
	return false
}

// Scan calls fn for every matching object of the request's range in key
// order, merged across shards at one RV, until fn returns false; Limit is
// ignored, Index narrows the walk as for List. Memory stays bounded by
// the per-shard batches whatever the size of the result, which is what
// watch-list streaming of the initial state needs. It returns the
// snapshot RV.
func (s *Store) Scan(req ListRequest, fn func(*Object) bool) (uint64, error) {
	snaps, rv, err := s.snapshots(req.SnapshotRV)
	if err != nil {
		return 0, err
	}
	m := newMerger(&s.batches, snaps, keyhash.NamespacePrefix(req.Namespace), req.StartKeyExclusive, 0, req.Index)
	defer m.release()
	for o := m.next(); o != nil; o = m.next() {
		if (req.Match == nil || req.Match(o)) && !fn(o) {
			break
		}
	}
	return rv, nil
}

// cursor walks one shard's snapshot in key order, fetching a batch at a time
// so that the merge needs neither goroutines nor a full copy of the shard.
// Its batch buffer comes from the Store's pool and goes back when the
// read ends (merger.release): a full LIST grew a buffer of maxBatch per
// shard by appends, about a sixth of what a tier allocated under a flood
// of them.
type cursor struct {
	snap   Snapshot
	prefix string
	after  string // last key fetched
	// index, when its Field is set, restricts the walk to its value
	// (Snapshot.rangeValue); probe is that walk's lookup scratch.
	index IndexValue
	probe *Object
	buf   []*Object
	pos   int
	batch int
	done  bool
	// pool is where buf comes from (nil: allocated).
	pool *sync.Pool
}

func (c *cursor) head() *Object {
	if c.pos < len(c.buf) {
		return c.buf[c.pos]
	}
	if c.done {
		return nil
	}
	if c.buf == nil {
		c.buf = c.takeBuffer()
	}
	c.buf = c.buf[:0]
	c.pos = 0
	add := func(o *Object) bool {
		c.buf = append(c.buf, o)
		return len(c.buf) < c.batch
	}
	if c.index.Field == "" {
		c.snap.Range(c.prefix, c.after, add)
	} else {
		if c.probe == nil {
			c.probe = &Object{}
		}
		c.snap.rangeValue(c.index, c.prefix, c.after, c.probe, add)
	}
	if len(c.buf) < c.batch {
		c.done = true
	}
	if len(c.buf) == 0 {
		return nil
	}
	c.after = c.buf[len(c.buf)-1].Key
	// Later batches can be larger: a caller that went past the first
	// batch is probably filtering and will scan a lot.
	c.batch = min(c.batch*2, maxBatch)
	return c.buf[0]
}

const (
	minBatch = 16
	maxBatch = 1024
)

func (c *cursor) takeBuffer() []*Object {
	if c.pool != nil {
		if b, ok := c.pool.Get().(*[]*Object); ok {
			return *b
		}
	}
	return make([]*Object, 0, maxBatch)
}

// giveBack returns buf to the pool, cleared: a pooled buffer must not
// keep replaced objects alive.
func (c *cursor) giveBack() {
	if c.pool == nil || cap(c.buf) != maxBatch {
		return
	}
	b := c.buf[:cap(c.buf)]
	clear(b)
	b = b[:0]
	c.buf = nil
	c.pool.Put(&b)
}

// merger is a k-way merge of cursors by key (a min-heap of non-empty cursors).
type merger struct {
	cursors []*cursor
	// all is every cursor, exhausted or not, for release.
	all []*cursor
}

// release gives the cursors' buffers back; the merger is not used after.
func (m *merger) release() {
	for _, c := range m.all {
		c.giveBack()
	}
}

func newMerger(pool *sync.Pool, snaps []Snapshot, prefix, startKeyExclusive string, limit int64, index IndexValue) *merger {
	batch := maxBatch
	if limit > 0 {
		// The page needs at most limit items from one shard, and about
		// limit/len(snaps) on average for an unfiltered list.
		batch = int(min(max(limit/int64(len(snaps))+1, minBatch), maxBatch))
	}
	m := &merger{all: make([]*cursor, 0, len(snaps))}
	for _, sn := range snaps {
		c := &cursor{snap: sn, prefix: prefix, after: startKeyExclusive, batch: batch, index: index, pool: pool}
		m.all = append(m.all, c)
		if c.head() != nil {
			m.cursors = append(m.cursors, c)
		}
	}
	heap.Init(m)
	return m
}

func (m *merger) Len() int { return len(m.cursors) }

// Less reads the buffers directly: a cursor in the heap always has a
// buffered head (next refills before re-inserting it).
func (m *merger) Less(i, j int) bool {
	a, b := m.cursors[i], m.cursors[j]
	return a.buf[a.pos].Key < b.buf[b.pos].Key
}
func (m *merger) Swap(i, j int) { m.cursors[i], m.cursors[j] = m.cursors[j], m.cursors[i] }
func (m *merger) Push(x any)    { m.cursors = append(m.cursors, x.(*cursor)) }
func (m *merger) Pop() any {
	c := m.cursors[len(m.cursors)-1]
	m.cursors = m.cursors[:len(m.cursors)-1]
	return c
}

func (m *merger) peek() *Object {
	if len(m.cursors) == 0 {
		return nil
	}
	return m.cursors[0].head()
}

func (m *merger) next() *Object {
	if len(m.cursors) == 0 {
		return nil
	}
	c := m.cursors[0]
	o := c.head()
	c.pos++
	if c.head() == nil {
		heap.Pop(m)
	} else {
		heap.Fix(m, 0)
	}
	return o
}

// countRest counts the items not yet returned, without copying them (an
// unindexed merge: List never counts an indexed read).
func (m *merger) countRest() int64 {
	var n int64
	for _, c := range m.cursors {
		n += int64(len(c.buf) - c.pos)
		if !c.done {
			c.snap.Range(c.prefix, c.after, func(*Object) bool { n++; return true })
		}
	}
	return n
}

// Stats returns per-shard numbers for metrics.
func (s *Store) Stats() []ShardStats {
	out := make([]ShardStats, len(s.shards))
	for i, sh := range s.shards {
		out[i] = sh.Stats()
	}
	return out
}

// LastKey is the greatest key that would make a page of req continue:
// the greatest key of its namespace's range at its SnapshotRV (0 =
// latest), or with ContinueByIndex the greatest one with the index's value
// ("" when there is none). A fleet's front needs it to tell, as the
// apiserver does for a single store, whether anything follows a filtered
// page that every shard finished.
func (s *Store) LastKey(req ListRequest) (string, error) {
	snaps, _, err := s.snapshots(req.SnapshotRV)
	if err != nil {
		return "", err
	}
	prefix := keyhash.NamespacePrefix(req.Namespace)
	var last string
	for _, snap := range snaps {
		var k string
		var ok bool
		if req.Index.Field != "" && req.ContinueByIndex {
			k, ok = snap.lastWithValue(req.Index, prefix)
		} else {
			k, ok = snap.Last(prefix)
		}
		if ok && k > last {
			last = k
		}
	}
	return last, nil
}

package fleet

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"math"
	"net/url"
	"strconv"
	"sync"

	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

var _ front.ItemStreamer = (*Source)(nil)

// List reads a page: every shard's page at one RV, merged by key, cut at
// the limit, with the continuation and remaining count a single store
// holding all shards would give (store.Store.List).
func (s *Source) List(req store.ListRequest) (store.ListResult, error) {
	var items []*store.Object
	var a arena
	res, err := s.merge(req, nil, func(c *cursor) error {
		items = append(items, c.object(&a))
		return nil
	})
	if err != nil {
		return store.ListResult{}, err
	}
	res.Items = items
	if res.Items == nil {
		res.Items = []*store.Object{}
	}
	return res, nil
}

// StreamItems is List handing each item's stored bytes to item as the
// shards' streams are merged instead of collecting them
// (front.ItemStreamer): the front holds about one record per shard, and a
// page's items are never copied into objects. head gets the RV before the
// first item; item gets each item's content hash with its bytes (0 when
// its shard sent none).
func (s *Source) StreamItems(req store.ListRequest, head func(rv uint64) error, item func(raw []byte, contentHash uint64) error) (store.ListResult, error) {
	return s.merge(req, head, func(c *cursor) error { return item(c.raw, c.hash) })
}

// merge reads the page of req at one RV and calls item for each of its
// items in key order (the cursor's head, valid during the call); head, when
// set, first gets the RV. The result has no items.
//
// A page of limit items asks each shard for about its share of them
// (pageStep), not for limit: keys hash uniformly over shards, so with N
// shards a shard holds about limit/N of the page. A shard whose share ran
// out before the page was full is asked again for the rest, after its last
// key, at the same RV. The earlier protocol asked every shard for limit
// items, any of which could have been next: a 2-shard page of 500 moved
// ~1,000 items to the front, and half of them were read only to be counted.
func (s *Source) merge(req store.ListRequest, head func(rv uint64) error, item func(c *cursor) error) (store.ListResult, error) {
	rv := s.snapshotRV(req.SnapshotRV)
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	res := store.ListResult{RV: rv}
	var taken int64
	var need func() int64
	if req.Limit > 0 {
		need = func() int64 { return req.Limit - taken }
	}
	step := pageStep(req.Limit, len(s.client.topo.Shards))
	m, err := s.openAll(ctx, req, rv, step, need)
	if err != nil && req.SnapshotRV == 0 {
		// The latest state, which a shard no longer holds at the merged
		// watermark: read it at the apiserver's current RV (latestRV).
		if rv, err = s.latestRV(err); err == nil {
			res.RV = rv
			m, err = s.openAll(ctx, req, rv, step, need)
		}
	}
	if err != nil {
		return store.ListResult{}, timedOut(err)
	}
	defer m.close()
	if head != nil {
		if err := head(rv); err != nil {
			return store.ListResult{}, err
		}
	}
	var last string
	for req.Limit <= 0 || taken < req.Limit {
		c := m.peek()
		if c == nil {
			break
		}
		// The shards applied the selector (req.Selector); the items carry
		// no labels or field values to match again.
		if err := item(c); err != nil {
			return store.ListResult{}, err
		}
		if taken++; taken == req.Limit {
			last = string(c.key)
		}
		if err := m.pop(); err != nil {
			return store.ListResult{}, timedOut(err)
		}
	}
	if req.Limit <= 0 || taken < req.Limit {
		// The page is not full: every shard scanned its whole range.
		return res, nil
	}
	// A full page continues when any shard has an item after its last key:
	// one not taken from its page, one after its page (it stopped at its
	// step or the limit), or — for a shard that scanned to its end — a
	// non-matching item after the page's last key (the apiserver's
	// hasMore).
	var remaining int64
	more := false
	for _, c := range m.cursors {
		untaken, err := c.drain()
		if err != nil {
			return store.ListResult{}, timedOut(err)
		}
		remaining += untaken
		if untaken > 0 || c.end.Continue != "" || c.end.LastKey > last {
			more = true
		}
		if c.end.Remaining != nil {
			remaining += *c.end.Remaining
		}
	}
	if !more {
		return res, nil
	}
	res.ContinueKey = last
	if skipCount(req) {
		// What the previous page counted, minus this page: no shard walks
		// the rest of its range again (standalone subtracts the same way).
		remaining = *req.RemainingAfterStart - taken
		if remaining < 0 {
			// A count that cannot be right (an edited token): read the
			// page again, counting, for the count alone.
			req.RemainingAfterStart = nil
			counted, err := s.merge(req, nil, func(*cursor) error { return nil })
			if err != nil {
				return store.ListResult{}, err
			}
			res.RemainingItemCount = counted.RemainingItemCount
			return res, nil
		}
	}
	if req.Match == nil {
		res.RemainingItemCount = &remaining
	}
	return res, nil
}

// pageStep is how many items a page of limit asks each of n shards for:
// the expected share limit/n plus four standard deviations of the binomial
// spread of a page's keys over the shards (a shard needs asking again for
// about 3 pages in 100,000), at most limit. 500 items from 2 shards: 296
// each; from 4: 165 each. No limit: 0 (everything).
func pageStep(limit int64, n int) int64 {
	if limit <= 0 || n <= 1 {
		return limit
	}
	p := 1 / float64(n)
	mean := float64(limit) * p
	sd := math.Sqrt(float64(limit) * p * (1 - p))
	return min(int64(math.Ceil(mean+4*sd))+1, limit)
}

// skipCount: the request carries the previous page's count of an
// unfiltered list, so the shards need not count.
func skipCount(req store.ListRequest) bool {
	return req.Match == nil && req.RemainingAfterStart != nil
}

// Scan streams the range at one RV in key order (watch-list initial state).
func (s *Source) Scan(req store.ListRequest, fn func(*store.Object) bool) (uint64, error) {
	rv := s.snapshotRV(req.SnapshotRV)
	req.Limit = 0
	// No deadline: a watch-list streams as fast as its client reads; the
	// streams end when fn stops the scan (m.close).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := s.openAll(ctx, req, rv, 0, nil)
	if err != nil {
		return 0, err
	}
	defer m.close()
	var a arena
	var scratch store.Object
	for c := m.peek(); c != nil; c = m.peek() {
		o := &scratch
		if req.Transient {
			c.transient(o)
		} else {
			o = c.object(&a)
		}
		if !fn(o) { // filtered by the shards (req.Selector)
			return rv, nil
		}
		if err := m.pop(); err != nil {
			return 0, err
		}
	}
	return rv, nil
}

// openAll opens the list on every shard, step items each (0: all). need,
// when set, says how many more items the page needs: a shard whose step
// ended before the page was full is asked for that many more.
func (s *Source) openAll(ctx context.Context, req store.ListRequest, rv uint64, step int64, need func() int64) (*merger, error) {
	q := s.query("rv", strconv.FormatUint(rv, 10), "namespace", req.Namespace, "after", req.StartKeyExclusive,
		"labelSelector", req.Selector.Label, "fieldSelector", req.Selector.Field)
	shardwire.SetIndex(q, req.Index, req.ContinueByIndex)
	// The shards' part of a bulk request runs as low as the front's.
	shardwire.SetBulkNice(q, req.BulkNice)
	// The items' content hashes, computed by the shards at ingestion:
	// the front keys the compressed chunks it keeps by them.
	q.Set(shardwire.ParamContentHash, shardwire.ContentHashXXH64)
	if step > 0 {
		q.Set("limit", strconv.FormatInt(step, 10))
	}
	if skipCount(req) {
		q.Set("count", "false")
	}
	n := len(s.client.topo.Shards)
	cursors := make([]*cursor, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.client.askReplicas(i, func(prefer string) (err error) {
				cursors[i], err = s.openCursor(ctx, i, prefer, q, need)
				return err
			})
		}()
	}
	wg.Wait()
	m := &merger{}
	for _, c := range cursors {
		if c != nil {
			m.cursors = append(m.cursors, c)
		}
	}
	for _, err := range errs {
		if err != nil {
			m.close()
			return nil, err
		}
	}
	for _, c := range m.cursors {
		if c.ok {
			m.heap = append(m.heap, c)
		}
	}
	heap.Init(&m.heap)
	return m, nil
}

// openCursor opens shard i's list (the replica at prefer first, when set)
// and reads its head. Later pages are asked of the replica that answered
// the first: it holds the snapshot they continue.
func (s *Source) openCursor(ctx context.Context, i int, prefer string, q url.Values, need func() int64) (*cursor, error) {
	st, err := s.client.openPreferring(ctx, i, prefer, shardwire.PathList, q)
	if err != nil {
		return nil, err
	}
	c := &cursor{shard: i, s: st, client: s.client}
	if need != nil {
		c.more = func(after string) (*stream, error) {
			n := need()
			if n <= 0 {
				return nil, nil
			}
			next := url.Values{}
			for k, v := range q {
				next[k] = v
			}
			next.Set("after", after)
			next.Set("limit", strconv.FormatInt(n, 10))
			return s.client.openPreferring(ctx, i, c.s.endpoint, shardwire.PathList, next)
		}
	}
	if err := c.advance(); err != nil {
		c.s.Close()
		return nil, &replicaError{endpoint: st.endpoint, err: err}
	}
	return c, nil
}

// cursor reads one shard's list stream. Its head is read in place (a
// shardwire.View into the stream's buffer, valid until the cursor
// advances) unless the record is larger than the buffer; what the merge
// keeps of it is copied (object), what it passes on (StreamItems) or only
// counts (drain) is not.
type cursor struct {
	shard  int
	s      *stream
	client *Client
	// ok: the cursor has a head: key and raw are its key and stored bytes,
	// hash its content hash (0: the shard sent none), from view when
	// inPlace, else from obj.
	ok       bool
	key, raw []byte
	hash     uint64
	inPlace  bool
	view     shardwire.View
	obj      *store.Object
	// end is the end record of the last page read (once !ok).
	end shardwire.Header
	// more, when set, opens the shard's next page after a page that
	// ended with a continue key (nil stream: none is wanted).
	more func(after string) (*stream, error)
}

func (c *cursor) advance() error {
	if c.inPlace {
		c.inPlace = false
		if err := c.s.r.Skip(c.view); err != nil {
			return c.client.readError(c.shard, err)
		}
	}
	for {
		v, ok, err := c.s.r.PeekObject()
		if err != nil {
			return c.client.readError(c.shard, err)
		}
		if ok {
			c.ok, c.inPlace, c.view, c.key, c.raw, c.hash = true, true, v, v.Key, v.Raw, v.ContentHash
			return nil
		}
		rec, err := c.s.Next()
		if err != nil {
			return c.client.readError(c.shard, err)
		}
		switch rec.Kind {
		case shardwire.KindObject:
			c.ok, c.obj, c.key, c.raw, c.hash = true, rec.Object, []byte(rec.Object.Key), rec.Object.Raw, rec.Object.ContentHash
			return nil
		case shardwire.KindEnd:
			c.ok, c.end = false, rec.Header
			if c.end.Continue == "" || c.more == nil {
				return nil
			}
			next, err := c.more(c.end.Continue)
			if err != nil || next == nil {
				return err
			}
			c.s.Close()
			c.s = next
		case shardwire.KindError:
			return rec.Header.Error.Err()
		default:
			return c.client.readError(c.shard, errors.New("unexpected record in a list"))
		}
	}
}

// object is the head as a store object that outlives the cursor's buffer:
// its bytes copied into a (the items of a page share a few allocations
// instead of one each), Namespace and Name substrings of Key as ingestion
// makes them. The items of a list carry no labels or field values (the
// shards applied the selector).
func (c *cursor) object(a *arena) *store.Object {
	if !c.inPlace {
		return c.obj
	}
	v := c.view
	o := &store.Object{Key: string(v.Key), RV: v.RV, Raw: a.copy(v.Raw), ContentHash: v.ContentHash}
	o.Namespace, o.Name = keyParts(o.Key, v.Namespace, v.Name)
	return o
}

// transient sets o's Raw, RV and ContentHash to the head's, valid until
// the cursor advances (store.ListRequest.Transient): no copy.
func (c *cursor) transient(o *store.Object) {
	if !c.inPlace {
		o.Raw, o.RV, o.ContentHash = c.obj.Raw, c.obj.RV, c.obj.ContentHash
		return
	}
	o.Raw, o.RV, o.ContentHash = c.view.Raw, c.view.RV, c.view.ContentHash
}

// keyParts returns namespace and name as substrings of key when key is
// made of them (keyhash.Key), else as copies.
func keyParts(key string, ns, name []byte) (string, string) {
	switch {
	case len(ns) == 0 && key == string(name):
		return "", key
	case len(key) == len(ns)+1+len(name) && key[:len(ns)] == string(ns) && key[len(ns)] == '/' && key[len(ns)+1:] == string(name):
		return key[:len(ns)], key[len(ns)+1:]
	}
	return string(ns), string(name)
}

// drain reads the rest of the current page, counting the items not taken.
func (c *cursor) drain() (int64, error) {
	c.more = nil // the page is complete: count, do not fetch
	var n int64
	for c.ok {
		n++
		if err := c.advance(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// merger merges cursors by key (keys are unique across shards).
type merger struct {
	cursors []*cursor
	heap    cursorHeap
}

// peek is the cursor holding the smallest key, nil when all are done.
func (m *merger) peek() *cursor {
	if len(m.heap) == 0 {
		return nil
	}
	return m.heap[0]
}

// pop moves past the smallest key; the head peek returned is invalid
// afterwards.
func (m *merger) pop() error {
	c := m.heap[0]
	if err := c.advance(); err != nil {
		return err
	}
	if !c.ok {
		heap.Pop(&m.heap)
	} else {
		heap.Fix(&m.heap, 0)
	}
	return nil
}

func (m *merger) close() {
	for _, c := range m.cursors {
		c.s.Close()
	}
}

type cursorHeap []*cursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return bytes.Compare(h[i].key, h[j].key) < 0 }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*cursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

// arenaBlock is the allocation the items of a page are copied into; items
// larger than an eighth of it get their own.
const arenaBlock = 64 << 10

// arena copies items' bytes into shared blocks. A block lives as long as
// any item in it: fine for a page, which is dropped once written.
type arena struct{ block []byte }

func (a *arena) copy(b []byte) []byte {
	if len(b) > arenaBlock/8 {
		return bytes.Clone(b)
	}
	if cap(a.block)-len(a.block) < len(b) {
		a.block = make([]byte, 0, arenaBlock)
	}
	n := len(a.block)
	a.block = append(a.block, b...)
	return a.block[n:len(a.block):len(a.block)]
}

package fleet

import (
	"container/heap"
	"context"
	"errors"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/sharedwait"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// Source is one resource as a front reads it from the fleet.
type Source struct {
	id, label string
	client    *Client
	hub       *watch.Hub
	metrics   *metrics.Metrics
	log       logr.Logger

	synced   chan struct{}
	uncached atomic.Bool
	// waits shares the shards' freshness waits between concurrent reads.
	waits sharedwait.Group

	// merge state of the shards' change streams (see follow).
	mu      sync.Mutex
	started bool
	starts  []uint64 // each stream's first watermark, before started
	wm      []uint64 // per shard: every change up to it was received
	queues  [][]store.Event
	// streaming is, per shard, the endpoint of the replica its change
	// stream is read from ("" while reconnecting).
	streaming []string
}

var (
	_ front.Source    = (*Source)(nil)
	_ watch.Snapshots = (*Source)(nil)
)

// Options configure a Source.
type Options struct {
	Entry         catalog.Entry
	Client        *Client
	HistoryWindow time.Duration
	Metrics       *metrics.Metrics
	Log           logr.Logger
}

// NewSource returns the source; Run feeds its hub.
func NewSource(opts Options) *Source {
	n := len(opts.Client.topo.Shards)
	s := &Source{
		id: shardwire.ResourceID(opts.Entry.Resource.GVR), label: opts.Entry.Resource.String(),
		client: opts.Client, metrics: opts.Metrics, log: opts.Log,
		synced: make(chan struct{}),
		starts: make([]uint64, n), wm: make([]uint64, n), queues: make([][]store.Event, n), streaming: make([]string, n),
	}
	s.hub = watch.New(watch.Options{
		Resource: s.label, Store: s, Metrics: opts.Metrics, Log: opts.Log,
		HistoryWindow: opts.HistoryWindow, PrevIncluded: true,
	})
	return s
}

// Hub is the resource's watch fan-out, fed from the shards.
func (s *Source) Hub() *watch.Hub { return s.hub }

// Synced is closed once every shard's change stream is open and the hub
// has a starting RV they all reached.
func (s *Source) Synced() <-chan struct{} { return s.synced }

// AppliedRV is the merged watermark: every shard has applied it.
func (s *Source) AppliedRV() uint64 { return s.hub.LastRV() }

// UpstreamUncached is what the shards report for the resource.
func (s *Source) UpstreamUncached() bool { return s.uncached.Load() }

func (s *Source) query(kv ...string) url.Values {
	q := url.Values{"resource": {s.id}}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return q
}

// CurrentRV asks a shard for the apiserver's current RV (the shard fetches
// it after the request arrives, so after the client's request did).
func (s *Source) CurrentRV(ctx context.Context) (uint64, error) {
	var err error
	for i := range s.client.topo.Shards {
		var rec shardwire.Record
		if rec, err = s.client.call(ctx, i, "", shardwire.PathCurrentRV, s.query()); err == nil {
			return rec.Header.RV, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return 0, err
}

// WaitFresh makes every shard apply rv (each proves its progress to the
// apiserver if its stream is quiet) and waits until the merged stream
// reached it. Concurrent consistent reads share the shard calls: a read
// joins a wait in flight for an RV at least its own (most concurrent reads
// got the same RV from one coalesced fetch), so N reads waiting together
// cost each shard one wait, not N.
func (s *Source) WaitFresh(ctx context.Context, rv uint64) error {
	if s.hub.LastRV() >= rv {
		return nil
	}
	if err := s.waits.Wait(ctx, rv, s.waitShards); err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return &store.TooLargeResourceVersionError{RV: rv, Current: s.hub.LastRV(), Err: err}
		}
		return err
	}
	return s.hub.WaitFor(ctx, rv)
}

// waitShards asks every shard to apply rv.
func (s *Source) waitShards(ctx context.Context, rv uint64) error {
	// The first shard that fails ends the wait for the others: its error
	// (unreachable: 503) is the answer, not a timeout later.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(s.client.topo.Shards))
	var wg sync.WaitGroup
	for i := range s.client.topo.Shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The replica whose change stream feeds the hub: it is the one
			// whose progress the hub must see (another replica proving
			// its own would not move the merged watermark).
			if _, errs[i] = s.client.call(ctx, i, s.streamingFrom(i), shardwire.PathWait, s.query("rv", strconv.FormatUint(rv, 10))); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// snapshotRV is the RV to read every shard at: the requested one, or the
// merged watermark, which every shard has applied.
func (s *Source) snapshotRV(rv uint64) uint64 {
	if rv != 0 {
		return rv
	}
	return s.hub.LastRV()
}

// timedOut is err, or for a read that ran out of readTimeout the
// apiserver's 504 for a request that took too long.
func timedOut(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return apierrors.NewTimeoutError("reading from the fleet's shards took too long", 1)
	}
	return err
}

// readTimeout bounds a GET or a LIST page read from the shards (the
// apiserver's default request timeout): a shard that stops answering fails
// the request instead of holding it forever.
const readTimeout = time.Minute

// Get reads key from the shard owning it.
func (s *Source) Get(key string, snapshotRV uint64) (*store.Object, uint64, error) {
	topo := s.client.topo
	i := topo.ShardOf(keyhash.Shard(key, int(topo.HashShards)))
	rv := s.snapshotRV(snapshotRV)
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	st, err := s.client.open(ctx, i, shardwire.PathList, s.query("key", key, "rv", strconv.FormatUint(rv, 10)))
	if err != nil {
		return nil, 0, timedOut(err)
	}
	defer st.Close()
	var obj *store.Object
	for {
		rec, err := st.Next()
		if err != nil {
			return nil, 0, s.client.readError(i, err)
		}
		switch rec.Kind {
		case shardwire.KindObject:
			obj = rec.Object
		case shardwire.KindEnd:
			return obj, rec.Header.RV, nil
		case shardwire.KindError:
			return nil, 0, rec.Header.Error.Err()
		}
	}
}

// List reads a page: every shard's page at one RV, merged by key, cut at
// the limit, with the continuation and remaining count a single store
// holding all shards would give (store.Store.List).
func (s *Source) List(req store.ListRequest) (store.ListResult, error) {
	rv := s.snapshotRV(req.SnapshotRV)
	ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
	defer cancel()
	m, err := s.openAll(ctx, req, rv)
	if err != nil {
		return store.ListResult{}, timedOut(err)
	}
	defer m.close()
	res := store.ListResult{Items: []*store.Object{}, RV: rv}
	for req.Limit <= 0 || int64(len(res.Items)) < req.Limit {
		o, err := m.next()
		if err != nil {
			return store.ListResult{}, err
		}
		if o == nil {
			break
		}
		// The shards applied the selector (req.Selector); the items carry
		// no labels or field values to match again.
		res.Items = append(res.Items, o)
	}
	if req.Limit <= 0 || int64(len(res.Items)) < req.Limit {
		// The page is not full: every shard scanned its whole range.
		return res, nil
	}
	// A full page continues when any shard has an item after its last key:
	// one not taken from its page, one after its page (it stopped at the
	// limit), or — for a shard that scanned to its end — a non-matching
	// item after the page's last key (the apiserver's hasMore).
	last := res.Items[len(res.Items)-1].Key
	var remaining int64
	more := false
	for _, c := range m.cursors {
		untaken, err := c.drain()
		if err != nil {
			return store.ListResult{}, err
		}
		remaining += untaken
		if untaken > 0 || c.end.Continue != "" || c.end.LastKey > last {
			more = true
		}
		if c.end.Remaining != nil {
			remaining += *c.end.Remaining
		}
	}
	if more {
		res.ContinueKey = last
		if skipCount(req) {
			// What the previous page counted, minus this page: no shard
			// walks the rest of its range again (standalone subtracts the
			// same way).
			remaining = *req.RemainingAfterStart - int64(len(res.Items))
			if remaining < 0 {
				// A count that cannot be right (an edited token): count.
				req.RemainingAfterStart = nil
				return s.List(req)
			}
		}
		if req.Match == nil {
			res.RemainingItemCount = &remaining
		}
	}
	return res, nil
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
	m, err := s.openAll(ctx, req, rv)
	if err != nil {
		return 0, err
	}
	defer m.close()
	for {
		o, err := m.next()
		if err != nil {
			return 0, err
		}
		if o == nil {
			return rv, nil
		}
		if !fn(o) { // filtered by the shards (req.Selector)
			return rv, nil
		}
	}
}

// openAll opens the list on every shard.
func (s *Source) openAll(ctx context.Context, req store.ListRequest, rv uint64) (*merger, error) {
	q := s.query("rv", strconv.FormatUint(rv, 10), "namespace", req.Namespace, "after", req.StartKeyExclusive,
		"labelSelector", req.Selector.Label, "fieldSelector", req.Selector.Field)
	if req.Limit > 0 {
		q.Set("limit", strconv.FormatInt(req.Limit, 10))
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
			st, err := s.client.open(ctx, i, shardwire.PathList, q)
			if err != nil {
				errs[i] = err
				return
			}
			c := &cursor{shard: i, s: st, client: s.client}
			if errs[i] = c.advance(); errs[i] != nil {
				st.Close()
				return
			}
			cursors[i] = c
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
		if c.head != nil {
			m.heap = append(m.heap, c)
		}
	}
	heap.Init(&m.heap)
	return m, nil
}

// cursor reads one shard's list stream.
type cursor struct {
	shard  int
	s      *stream
	client *Client
	head   *store.Object // nil once the end record was read
	end    shardwire.Header
}

func (c *cursor) advance() error {
	rec, err := c.s.Next()
	if err != nil {
		return c.client.readError(c.shard, err)
	}
	switch rec.Kind {
	case shardwire.KindObject:
		c.head = rec.Object
	case shardwire.KindEnd:
		c.head, c.end = nil, rec.Header
	case shardwire.KindError:
		return rec.Header.Error.Err()
	default:
		return c.client.readError(c.shard, errors.New("unexpected record in a list"))
	}
	return nil
}

// drain reads the rest of the stream, counting the items not taken.
func (c *cursor) drain() (int64, error) {
	var n int64
	for c.head != nil {
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

func (m *merger) next() (*store.Object, error) {
	if len(m.heap) == 0 {
		return nil, nil
	}
	c := m.heap[0]
	o := c.head
	if err := c.advance(); err != nil {
		return nil, err
	}
	if c.head == nil {
		heap.Pop(&m.heap)
	} else {
		heap.Fix(&m.heap, 0)
	}
	return o, nil
}

func (m *merger) close() {
	for _, c := range m.cursors {
		c.s.Close()
	}
}

type cursorHeap []*cursor

func (h cursorHeap) Len() int           { return len(h) }
func (h cursorHeap) Less(i, j int) bool { return h[i].head.Key < h[j].head.Key }
func (h cursorHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *cursorHeap) Push(x any)        { *h = append(*h, x.(*cursor)) }
func (h *cursorHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

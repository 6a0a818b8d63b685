package fleet

import (
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
	"github.com/cachetier/cachetier/cache-server/internal/coalesce"
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
	// freshness bounds latestRV's wait (Options.FreshnessTimeout).
	freshness time.Duration

	synced   chan struct{}
	uncached atomic.Bool
	// waits shares the shards' freshness waits between concurrent reads.
	waits sharedwait.Group
	// rvFetch shares the shards' RV fetches between reads (CurrentRV).
	rvFetch *coalesce.Runs

	// merge state of the shards' change streams (see follow).
	mu      sync.Mutex
	started bool
	starts  []uint64 // each stream's first watermark, before started
	wm      []uint64 // per shard: every change up to it was received
	queues  [][]store.Event
	// streaming is, per shard, the endpoint of the replica its change
	// stream is read from ("" while reconnecting).
	streaming []string
	// sizes are the shards' latest reported sizes, seatCPU their CPU
	// per seat's worth of work (sizes.go).
	sizes   []store.Sizes
	seatCPU []time.Duration
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
	// FreshnessTimeout bounds the freshness wait of a read of the latest
	// state that the merged watermark cannot serve (latestRV); the
	// profile's freshnessTimeout, as a consistent read's wait.
	FreshnessTimeout time.Duration
	Metrics          *metrics.Metrics
	Log              logr.Logger
}

// NewSource returns the source; Run feeds its hub.
func NewSource(opts Options) *Source {
	n := len(opts.Client.topo.Shards)
	s := &Source{
		id: shardwire.ResourceID(opts.Entry.Resource.GVR), label: opts.Entry.Resource.String(),
		client: opts.Client, metrics: opts.Metrics, log: opts.Log, freshness: opts.FreshnessTimeout,
		synced: make(chan struct{}),
		starts: make([]uint64, n), wm: make([]uint64, n), queues: make([][]store.Event, n), streaming: make([]string, n),
		sizes: make([]store.Sizes, n), seatCPU: make([]time.Duration, n),
	}
	s.rvFetch = coalesce.New(s.fetchCurrentRV)
	// The series exists from the start: a refresh is rare, and its panel
	// (and a rate over it) shows 0 rather than nothing.
	opts.Metrics.FleetLatestReadsRefreshed.WithLabelValues(s.label)
	s.hub = watch.New(watch.Options{
		Resource: s.label, Store: s, FieldIndexes: opts.Entry.FieldIndexes, Metrics: opts.Metrics, Log: opts.Log,
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

// CurrentRV is the apiserver's current RV from a shard call that started
// after the request of ctx was received (coalesce.Received), shared with
// the front's other reads: the shard fetches the RV after its own request
// arrives, so after the client's did. A front's queued consistent reads
// share one call, as a standalone tier's share one fetch.
func (s *Source) CurrentRV(ctx context.Context) (uint64, error) {
	return s.rvFetch.Since(ctx, coalesce.Received(ctx))
}

// fetchCurrentRV asks a shard (the next one if a shard does not answer).
func (s *Source) fetchCurrentRV(ctx context.Context) (uint64, error) {
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

// latestRV is the RV at which to read the latest state when the merged
// watermark is older than what a shard still holds: err is that shard's
// 410 (every replica of it restarted since, loading above the watermark —
// a rolled StatefulSet, a lost node — while the other shards' streams are
// quiet and the watermark waits for the apiserver's next bookmark, up to a
// minute). The read then takes the apiserver's current RV and waits for
// every shard to apply it, as a consistent read does: kube-apiserver never
// answers 410 to a read of its latest state (RV=0 LIST, GET). Any other
// error, or a wait that fails, is returned as err.
func (s *Source) latestRV(err error) (uint64, error) {
	if !errors.As(err, new(*store.ExpiredError)) {
		return 0, err
	}
	timeout := s.freshness
	if timeout <= 0 {
		timeout = defaultFreshness
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rv, ferr := s.CurrentRV(ctx)
	if ferr == nil {
		ferr = s.WaitFresh(ctx, rv)
	}
	if ferr != nil {
		s.log.Info("read of the latest state: a shard no longer holds the merged watermark, and the shards could not be brought to the apiserver's current RV", "resource", s.label, "watermark", s.hub.LastRV(), "err", err.Error(), "waitErr", ferr.Error())
		return 0, err
	}
	s.metrics.FleetLatestReadsRefreshed.WithLabelValues(s.label).Inc()
	return rv, nil
}

// defaultFreshness is the profile's default freshnessTimeout, for a Source
// whose options give none.
const defaultFreshness = 3 * time.Second

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
	// A restarted replica holds nothing before its load: ask the other
	// (Client.otherReplica).
	var obj *store.Object
	var objRV uint64
	get := func(rv uint64) error {
		q := s.query("key", key, "rv", strconv.FormatUint(rv, 10))
		return s.client.askReplicas(i, func(prefer string) (err error) {
			obj, objRV, err = s.getFrom(ctx, i, prefer, q)
			return err
		})
	}
	err := get(rv)
	if err != nil && snapshotRV == 0 {
		if rv, err = s.latestRV(err); err == nil {
			err = get(rv)
		}
	}
	if err != nil {
		return nil, 0, err
	}
	return obj, objRV, nil
}

func (s *Source) getFrom(ctx context.Context, i int, prefer string, q url.Values) (*store.Object, uint64, error) {
	st, err := s.client.openPreferring(ctx, i, prefer, shardwire.PathList, q)
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
			return nil, 0, &replicaError{endpoint: st.endpoint, err: rec.Header.Error.Err()}
		}
	}
}

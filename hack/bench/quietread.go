package main

// -mode quietread (issue 12): how long a consistent read of a quiet
// resource waits while other resources change (see apicost.go for the
// setup both modes share).
//
// Reads are open loop: one starts right after every Lease renewal, whether
// or not the previous one has finished. A read that started only once the
// previous one had ended would be tied to the apiserver's bookmark timer,
// which ends every tier read of a quiet resource: it would begin at most a
// second after the tick that ended the previous read (the next renewal),
// and the next tick comes 1–1.25 s after that one, so it would wait
// E[tick period] - E[offset] = 1.125 - 0.5 s = 625 ms on average. A
// client whose requests do not depend on the cacher's timer — every real
// one — meets the timer at a random phase: it waits the residual of a
// tick period, 565 ms on average (E[T²]/2E[T] for T uniform on 1–1.25 s),
// with a median of 562 ms.
//
// The measured reads are the steady state: the tier's progress probes run
// (one unmeasured read after the idle window restarts them). Then each tier
// gets -quiet-cold-reads reads, each coldGap after the last, so that its
// probes have stopped: the first probe of a cold start is due at the first
// tick in the cacher's next one-second bucket, so it misses a tick that
// falls in the bucket it opened in (upstream/progress.go), and a cold read
// often waits one tick more. They are reported on their own line.
//
// tickObserver records the apiserver's bookmark ticks, so that each tier
// read can be placed against the first tick after it began: a read ends
// at that tick unless the tier had no progress probe due then.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// leaseWriter renews a Lease every second until stopped; each renewal's
// completion is sent on renewed (dropped when nobody listens).
type leaseWriter struct {
	renewed chan struct{}
	count   atomic.Int64
	failed  atomic.Int64
	stop    func()
}

func startLeaseWriter(ctx context.Context, kc kubernetes.Interface) (*leaseWriter, error) {
	leases := kc.CoordinationV1().Leases(metav1.NamespaceDefault)
	holder := "bench"
	l, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-writer"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &leaseWriter{renewed: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			next, err := leases.Update(ctx, l, metav1.UpdateOptions{})
			if err != nil {
				w.failed.Add(1)
				if cur, gerr := leases.Get(ctx, l.Name, metav1.GetOptions{}); gerr == nil {
					l = cur
				}
				continue
			}
			l = next
			w.count.Add(1)
			select {
			case w.renewed <- struct{}{}:
			default:
			}
		}
	}()
	w.stop = func() { cancel(); wg.Wait() }
	return w, nil
}

// quietReads collects the reads of one server; they run concurrently.
type quietReads struct {
	// measuring: reads started from now on count (warm-up reads do not).
	measuring atomic.Bool
	// randomPhase: a read starts a random part of a second after the
	// renewal, not right after it (see the cold reads in runQuietRead).
	randomPhase bool
	wg          sync.WaitGroup

	mu        sync.Mutex
	list, get []float64
	spans     []readSpan
	err       error
}

type readSpan struct {
	n          int // the read's number
	start, end time.Time
}

func (q *quietReads) record(n int, isGet bool, start time.Time, err error) {
	end := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		if q.err == nil {
			q.err = err
		}
		return
	}
	if isGet {
		q.get = append(q.get, ms(end.Sub(start)))
	} else {
		q.list = append(q.list, ms(end.Sub(start)))
	}
	q.spans = append(q.spans, readSpan{n, start, end})
}

func (q *quietReads) firstErr() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

func (q *quietReads) all() []float64 {
	return append(append([]float64(nil), q.list...), q.get...)
}

// coldGap: longer than the tier's probeLinger (10 s) plus its last probe's
// life (3 s), so the read after it finds no progress probe running.
const coldGap = 14 * time.Second

func runQuietRead(ctx context.Context, o options, a *apiCostOptions) error {
	d := dataset{name: "quiet", count: a.quietObjs, size: 1024}
	env, tiers, ns, err := startSeededTiers(ctx, o, d)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	writer, err := startLeaseWriter(ctx, env.kc)
	if err != nil {
		return err
	}
	defer writer.stop()
	list := "/api/v1/namespaces/" + ns + "/configmaps"
	adminClient, err := rest.HTTPClientFor(env.admin)
	if err != nil {
		return err
	}
	ticks, err := startTickObserver(ctx, adminClient, env.admin.Host+list)
	if err != nil {
		return err
	}
	defer ticks.stop()
	fmt.Fprintf(os.Stderr, "bench: load average before %s\n", loadAvg())
	type server struct {
		name string
		cfg  *rest.Config
		tier *tierKind
	}
	servers := []server{{"kube-apiserver", env.admin, nil}}
	for i, k := range tiers.kinds {
		servers = append(servers, server{k.name, k.direct, &tiers.kinds[i]})
	}
	type result struct {
		name             string
		reads, cold      *quietReads
		cpuPerRead, idle float64
		requests         string // the tier's requests to the apiserver per read
	}
	var results []result
	for _, s := range servers {
		client, err := rest.HTTPClientFor(s.cfg)
		if err != nil {
			return err
		}
		// start starts read n into q right after the next renewal and
		// returns: the reads' pace is the writer's, never the server's.
		start := func(q *quietReads, n int) error {
			select {
			case <-writer.renewed: // etcd's revision just moved past what any read proved
			case <-ctx.Done():
				return ctx.Err()
			}
			if q.randomPhase {
				time.Sleep(rand.N(time.Second))
			}
			u, isGet := s.cfg.Host+list, n%2 == 1
			if isGet {
				u += "/cm-" + fmt.Sprintf("%06d", rand.IntN(d.count))
			}
			measured := q.measuring.Load()
			q.wg.Add(1)
			go func(t0 time.Time) {
				defer q.wg.Done()
				err := readAll(client, u)
				if measured || err != nil {
					q.record(n, isGet, t0, err)
				}
			}(time.Now())
			return q.firstErr()
		}
		q := &quietReads{}
		var before map[string]float64
		if s.tier != nil {
			before = s.tier.upstreamCounters()
		}
		i := 0
		// After the idle window the tier's progress probes have stopped;
		// one unmeasured read restarts them, so the measured reads see the
		// steady state (the cold case is measured on its own below). The
		// CPU figure includes the Lease writer's and the tick observer's
		// own cost on both sides (the idle window runs them too), so it
		// cancels out; the last read may still run when the window closes,
		// its share is within the noise (see docs/benchmarks.md).
		rewarm := func() error {
			err := start(q, 0)
			q.measuring.Store(true)
			return err
		}
		cost, err := measureCalls(env.apiPID, nil, a.quietIter, a.settle, func() error { i++; return start(q, i) }, rewarm)
		cpu, idle := cost.api, cost.apiIdle
		q.wg.Wait()
		if err == nil {
			err = q.firstErr()
		}
		if err != nil {
			return err
		}
		r := result{name: s.name, reads: q, cpuPerRead: cpu, idle: idle}
		if s.tier != nil {
			r.requests = counterDelta(before, s.tier.upstreamCounters(), float64(i))
			// Whether a cold read's first probe is due at the next tick
			// depends on where in the cacher's one-second bucket it
			// arrives; the writer's renewals keep one phase to the
			// buckets for the whole run, so cold reads right after them
			// would all meet the same case.
			r.cold = &quietReads{randomPhase: true}
			r.cold.measuring.Store(true)
			for n := range a.quietCold {
				time.Sleep(coldGap)
				c0 := s.tier.upstreamCounters()
				if err := start(r.cold, n); err != nil {
					return err
				}
				r.cold.wg.Wait()
				fmt.Fprintf(os.Stderr, "bench: %s: cold read %d: requests to the apiserver: %s\n", s.name, n, counterDelta(c0, s.tier.upstreamCounters(), 1))
			}
			if err := r.cold.firstErr(); err != nil {
				return err
			}
		}
		results = append(results, r)
		all := q.all()
		sort.Float64s(all)
		fmt.Fprintf(os.Stderr, "bench: %s: every read, sorted (ms): %.0f\n", s.name, all)
	}
	fmt.Printf("consistent reads of a quiet resource (%d ConfigMaps), one right after each Lease renewal (one a second, open loop); %d reads per server; load average after %s\n", d.count, a.quietIter, loadAvg())
	fmt.Printf("%-18s %10s %10s %10s %10s %10s %10s %18s\n", "server", "LIST p50", "LIST p99", "GET p50", "GET p99", "all p50", "all p99", "apiserver CPU/read")
	for _, r := range results {
		q := r.reads
		all := q.all()
		fmt.Printf("%-18s %10s %10s %10s %10s %10s %10s %18.3f\n", r.name, msStr(pct(q.list, 50)), msStr(pct(q.list, 99)), msStr(pct(q.get, 50)), msStr(pct(q.get, 99)),
			msStr(pct(all, 50)), msStr(pct(all, 99)), r.cpuPerRead)
	}
	fmt.Println("targets for the tiers: p50 <= 600 ms, p99 <= 1300 ms (all reads)")
	for _, r := range results {
		if r.requests != "" {
			fmt.Printf("%s: requests to the apiserver per read (summed over its processes): %s\n", r.name, r.requests)
		}
	}
	tickTimes := ticks.times()
	for _, r := range results[1:] {
		fmt.Printf("%s: %s\n", r.name, placeReads(r.reads.spans, tickTimes))
	}
	for _, r := range results[1:] {
		all := r.cold.all()
		fmt.Printf("%s, cold (each read %s after the last, when its progress probes have stopped, up to a second after a renewal), %d reads: p50 %s, max %s; %s\n",
			r.name, coldGap, len(all), msStr(pct(all, 50)), msStr(pct(all, 100)), placeReads(r.cold.spans, tickTimes))
	}
	if n := writer.failed.Load(); n > 0 {
		fmt.Printf("lease writer: %d failed renewals\n", n)
	}
	return nil
}

// placeReads places each read against the first bookmark tick after it
// began: how long that tick took to come (the floor no proof can beat),
// and whether the read ended with it (within tickSlack) or at a later one.
func placeReads(spans []readSpan, ticks []time.Time) string {
	const tickSlack = 100 * time.Millisecond
	var toTick, afterTick []float64
	var later []int
	unplaced := 0
	for _, s := range spans {
		k := sort.Search(len(ticks), func(i int) bool { return ticks[i].After(s.start) })
		if k == len(ticks) {
			unplaced++
			continue
		}
		toTick = append(toTick, ms(ticks[k].Sub(s.start)))
		if s.end.After(ticks[k].Add(tickSlack)) {
			later = append(later, s.n)
			continue
		}
		afterTick = append(afterTick, ms(s.end.Sub(ticks[k])))
	}
	slices.Sort(later)
	out := fmt.Sprintf("the apiserver's first bookmark tick after a read began came after p50 %s (p99 %s); %d reads ended with it (p50 %s after it), %d at a later tick %v",
		msStr(pct(toTick, 50)), msStr(pct(toTick, 99)), len(afterTick), msStr(pct(afterTick, 50)), len(later), later)
	if unplaced > 0 {
		out += fmt.Sprintf(", %d after the last tick observed", unplaced)
	}
	return out
}

// tickObserver records when the apiserver's cacher of the quiet resource
// sends bookmarks, from watches of its own: one opened every
// tickObserverCadence with timeoutSeconds=3, each due one bookmark a
// second after it opened (upstream/progress.go explains the cacher's
// rules), so every tick finds several due. A watch starts at the highest
// RV seen so far, so it gets a bookmark only at a tick whose RV advanced —
// the ticks that can end a read.
type tickObserver struct {
	mu    sync.Mutex
	ticks []time.Time
	rv    atomic.Uint64
	stop  func()
}

const tickObserverCadence = 300 * time.Millisecond

func startTickObserver(ctx context.Context, c *http.Client, listURL string) (*tickObserver, error) {
	rvs, err := listRV(ctx, c, listURL+"?limit=1")
	if err != nil {
		return nil, err
	}
	rv, err := strconv.ParseUint(rvs, 10, 64)
	if err != nil {
		return nil, err
	}
	t := &tickObserver{}
	t.rv.Store(rv)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		every := time.NewTicker(tickObserverCadence)
		defer every.Stop()
		for {
			wg.Add(1)
			go func() { defer wg.Done(); t.watchOnce(ctx, c, listURL) }()
			select {
			case <-every.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.stop = func() { cancel(); wg.Wait() }
	return t, nil
}

func (t *tickObserver) watchOnce(ctx context.Context, c *http.Client, listURL string) {
	q := url.Values{"watch": {"1"}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {"3"},
		"resourceVersion": {strconv.FormatUint(t.rv.Load(), 10)}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, listURL+"?"+q.Encode(), nil)
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			return
		}
		if ev.Type != "BOOKMARK" {
			continue
		}
		now := time.Now()
		rv, _ := strconv.ParseUint(ev.Object.Metadata.ResourceVersion, 10, 64)
		for cur := t.rv.Load(); rv > cur && !t.rv.CompareAndSwap(cur, rv); cur = t.rv.Load() {
		}
		t.mu.Lock()
		// Every due watch gets the tick's bookmark within milliseconds:
		// one tick, however many watches saw it.
		if n := len(t.ticks); n == 0 || now.Sub(t.ticks[n-1]) > 500*time.Millisecond {
			t.ticks = append(t.ticks, now)
		}
		t.mu.Unlock()
		return // one bookmark per watch (the cacher sends no second before the timeout)
	}
}

// times returns the ticks seen, in order.
func (t *tickObserver) times() []time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Time(nil), t.ticks...)
}

func msStr(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + " ms" }

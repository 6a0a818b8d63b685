package main

// WATCH benchmarks, tier vs kube-apiserver (issue "Performance"):
//
//   - watchlist: KEP-3157's scenario. N Secrets of S KiB in one namespace;
//     K concurrent watch-list clients (client-go informers with the
//     WatchListClient feature on, or raw watch-list requests) against the
//     tier, then against the apiserver. Time until all K are synced (got the
//     k8s.io/initial-events-end bookmark) and the server's peak resident
//     memory during the run (VmRSS sampled every -rss-interval, and VmHWM
//     after resetting it through /proc/<pid>/clear_refs).
//   - fanout: W watchers of the ConfigMaps of one namespace; a writer patches
//     those ConfigMaps U times a second for D through the apiserver, each
//     patch carrying its write time (UnixNano) in an annotation; every
//     watcher records receive time − write time per event. Delivered
//     events/s and p50/p99 delivery latency, tier vs apiserver.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	clientfeatures "k8s.io/client-go/features"
)

type watchOptions struct {
	// midRun, when set, is called (once, in its own goroutine) when half
	// the watch-list clients have synced: the tier's memory mid-run.
	midRun func(cfg *rest.Config)
	// overBound, when set, is called (once, in its own goroutine) when the
	// server's RSS first exceeds boundBytes: the memory of a run that
	// breaks the bound, while it does.
	overBound         func(cfg *rest.Config)
	boundBytes        uint64
	watchList, fanout bool

	// watchlist
	secrets, secretKiB, clients int
	client                      string // informer or raw
	protobuf                    bool
	syncTimeout                 time.Duration
	rssInterval                 time.Duration

	// fanout
	watchers, rate, objects, transports, writers int
	duration, drain                              time.Duration
	// baseline is how long the writer runs alone first (wholecost.go).
	baseline time.Duration
}

func watchFlags() *watchOptions {
	var w watchOptions
	// -v etc.: client-go's reflectors log why a watch-list was retried at -v=2.
	klog.InitFlags(flag.CommandLine)
	flag.IntVar(&w.secrets, "secrets", 200, "watchlist: Secrets in the data set")
	flag.IntVar(&w.secretKiB, "secret-kib", 500, "watchlist: KiB of data per Secret")
	flag.IntVar(&w.clients, "informers", 64, "watchlist: concurrent watch-list clients")
	flag.StringVar(&w.client, "watchlist-client", "informer", "watchlist: informer (client-go SharedInformer, WatchListClient on, a transform drops Secret data) or raw (watch-list requests read until the initial-events-end bookmark, bodies discarded)")
	flag.BoolVar(&w.protobuf, "protobuf", true, "watchlist: informers use protobuf, client-go's default for built-in types since its typed clients call UseProtobufAsDefault; false: JSON")
	flag.DurationVar(&w.syncTimeout, "sync-timeout", 10*time.Minute, "watchlist: give up waiting for all clients to sync after this long")
	flag.DurationVar(&w.rssInterval, "rss-interval", 50*time.Millisecond, "watchlist: VmRSS sampling interval")
	flag.IntVar(&w.watchers, "watchers", 1000, "fanout: concurrent watchers")
	flag.IntVar(&w.rate, "updates", 200, "fanout: updates per second")
	flag.DurationVar(&w.duration, "duration", 60*time.Second, "fanout: how long the writer runs")
	flag.IntVar(&w.objects, "fanout-objects", 20, "fanout: ConfigMaps the writer updates round-robin")
	flag.IntVar(&w.transports, "transports", 4, "fanout: HTTP/2 transports the watchers share")
	flag.IntVar(&w.writers, "writers", 16, "fanout: concurrent writer goroutines (a tick finding all busy is dropped and counted)")
	flag.DurationVar(&w.drain, "drain", 15*time.Second, "fanout: after the writer stops, wait at most this long for the last events")
	flag.DurationVar(&w.baseline, "writer-alone", 20*time.Second, "fanout: how long the writer runs alone first (nothing watching), for the apiserver's CPU per write that the whole-cost rows subtract")
	return &w
}

func runWatch(ctx context.Context, o options, wo *watchOptions) error {
	if err := raiseNoFile(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: raising RLIMIT_NOFILE:", err)
	}
	// Before any client exists: client-go reads its gates once.
	setFeatureWatchListClient(true)
	env, err := startEnv(ctx, &o)
	if err != nil {
		return err
	}
	defer env.cp.Stop()
	var rows []row
	var notes []string
	if wo.watchList {
		r, n, err := benchWatchList(ctx, env, o, wo)
		if err != nil {
			return err
		}
		rows, notes = append(rows, r...), append(notes, n...)
	}
	if wo.fanout {
		r, n, err := benchFanout(ctx, env, o, wo)
		if err != nil {
			return err
		}
		rows, notes = append(rows, r...), append(notes, n...)
	}
	printTable(os.Stdout, rows)
	for _, n := range notes {
		fmt.Println(n)
	}
	return nil
}

func raiseNoFile() error {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return err
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
	return nil
}

const mib = 1 << 20

// ---------------------------------------------------------------- watchlist

type watchListResult struct {
	firstSync, allSync, p50Sync time.Duration
	synced                      int
	baseRSS, peakRSS, hwm       uint64
	cpuSec                      float64
	// apiAboveIdle is the apiserver's CPU during the run minus its idle
	// rate (s): its own work when it serves the clients, what the tier's
	// run caused when the tier does (wholecost.go).
	apiAboveIdle            float64
	watchListReqs, listReqs int64
}

func benchWatchList(ctx context.Context, env *benchEnv, o options, wo *watchOptions) ([]row, []string, error) {
	const set = "secrets"
	ns := "bench-" + set
	start := time.Now()
	dataBytes, err := seedSecrets(ctx, env.kc, ns, set, wo.secrets, wo.secretKiB<<10, o.concurrency)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(os.Stderr, "bench: seeded %d Secrets x %d KiB (%.1f MiB JSON) in %s\n", wo.secrets, wo.secretKiB, float64(dataBytes)/mib, time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)

	// The RSS of a tier caching nothing: the process's fixed cost.
	if _, err := env.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-empty", Labels: map[string]string{"bench": "empty"}}}, metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	empty, err := startTier(ctx, env.cp, env.admin, o.binary, o.tierFlags, o.tierEnv, "empty", "secrets", 0, o.freshness)
	if err != nil {
		return nil, nil, err
	}
	time.Sleep(2 * time.Second)
	emptyRSS := rss(empty.pid)
	empty.stop()

	t, err := startTier(ctx, env.cp, env.admin, o.binary, o.tierFlags, o.tierEnv, set, "secrets", 0, o.freshness)
	if err != nil {
		return nil, nil, err
	}
	time.Sleep(2 * time.Second)
	fmt.Fprintf(os.Stderr, "bench: watch-list on the tier: %d %s clients\n", wo.clients, wo.client)
	if o.profileDir != "" {
		if err := saveTierMemory(t.cfg, filepath.Join(o.profileDir, "watchlist-tier-before"), true); err != nil {
			return nil, nil, err
		}
		wo.midRun = func(cfg *rest.Config) {
			if err := saveTierMemory(cfg, filepath.Join(o.profileDir, "watchlist-tier-midrun"), false); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
		}
		wo.boundBytes = uint64(1.5*float64(wo.secrets)*float64(wo.secretKiB<<10)) + uint64(wo.clients)*2<<20
		wo.overBound = func(cfg *rest.Config) {
			if err := saveTierMemory(cfg, filepath.Join(o.profileDir, "watchlist-tier-over-bound"), false); err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
		}
	}
	tierRes, err := measureWatchList(ctx, t.cfg, t.pid, env.apiPID, ns, wo)
	wo.midRun, wo.overBound = nil, nil
	t.stop()
	if err != nil {
		return nil, nil, fmt.Errorf("tier: %w", err)
	}
	time.Sleep(2 * time.Second)
	fmt.Fprintf(os.Stderr, "bench: watch-list on the apiserver: %d %s clients\n", wo.clients, wo.client)
	apiRes, err := measureWatchList(ctx, env.admin, env.apiPID, env.apiPID, ns, wo)
	if err != nil {
		return nil, nil, fmt.Errorf("apiserver: %w", err)
	}

	wire := "protobuf"
	if !wo.protobuf {
		wire = "JSON"
	}
	label := fmt.Sprintf("watch-list (%d Secrets x %d KiB, %d %s %s clients)", wo.secrets, wo.secretKiB, wo.clients, wire, wo.client)
	nan := math.NaN()
	// The data set is what the issue sizes: N x S of Secret data. Its JSON
	// (base64) is about a third larger; the bound uses the smaller figure.
	data := float64(wo.secrets) * float64(wo.secretKiB<<10)
	bound := 1.5*data + float64(wo.clients)*2*mib
	a, b := apiRes, tierRes
	rows := []row{
		{label, "clients synced", "", float64(a.synced), float64(b.synced), ""},
		{label, "first client synced", "ms", ms(a.firstSync), ms(b.firstSync), ""},
		{label, "p50 client synced", "ms", ms(a.p50Sync), ms(b.p50Sync), ""},
		{label, "all clients synced", "ms", ms(a.allSync), ms(b.allSync), ""},
		{label, "RSS of a tier caching nothing", "MiB", nan, float64(emptyRSS) / mib, ""},
		{label, "RSS before the clients started", "MiB", float64(a.baseRSS) / mib, float64(b.baseRSS) / mib, ""},
		{label, "peak RSS (VmRSS sampled)", "MiB", float64(a.peakRSS) / mib, float64(b.peakRSS) / mib, ""},
		{label, "peak RSS (VmHWM)", "MiB", float64(a.hwm) / mib, float64(b.hwm) / mib, ""},
		{label, "peak RSS growth over before", "MiB", float64(a.peakRSS-min(a.peakRSS, a.baseRSS)) / mib, float64(b.peakRSS-min(b.peakRSS, b.baseRSS)) / mib, ""},
		{label, "data set (N x S of Secret data)", "MiB", data / mib, data / mib, ""},
		{label, "data set as JSON (LIST body)", "MiB", float64(dataBytes) / mib, float64(dataBytes) / mib, ""},
		{label, "target for tier: 1.5 x data + K x 2 MiB", "MiB", nan, bound / mib, ""},
		{label, "server CPU during the run", "s", a.cpuSec, b.cpuSec, ""},
		{label, "apiserver CPU the tier's run causes (above idle)", "s", nan, b.apiAboveIdle, ""},
		{label, "whole CPU during the run above idle (tier: + what it causes)", "s", a.apiAboveIdle, b.cpuSec + b.apiAboveIdle, ""},
		{label, "watch-list / LIST requests sent", "", float64(a.watchListReqs), float64(b.watchListReqs), ""},
	}
	peak := max(b.peakRSS, b.hwm)
	verdict := "MET"
	if float64(peak) > bound || b.synced < wo.clients {
		verdict = "NOT MET"
	}
	notes := []string{fmt.Sprintf("watch-list target: %d/%d clients synced on the tier; tier peak RSS %.1f MiB vs bound 1.5 x %.1f MiB + %d x 2 MiB = %.1f MiB: %s",
		b.synced, wo.clients, float64(peak)/mib, data/mib, wo.clients, bound/mib, verdict)}
	if a.listReqs+b.listReqs > 0 {
		notes = append(notes, fmt.Sprintf("warning: clients sent LIST requests (apiserver %d, tier %d): some informers fell back from watch-list", a.listReqs, b.listReqs))
	}
	return rows, notes, nil
}

// seedSecrets creates ns (labelled bench=<set>) and n Secrets of size bytes
// of random data; it returns the size of their JSON LIST body.
func seedSecrets(ctx context.Context, kc kubernetes.Interface, ns, set string, n, size, concurrency int) (int64, error) {
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"bench": set}}}, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	if err := parallel(n, concurrency, func(i int) error {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%05d", i)}, Data: map[string][]byte{"payload": data}}
		_, err := kc.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
		return err
	}); err != nil {
		return 0, err
	}
	body, err := kc.CoreV1().RESTClient().Get().Namespace(ns).Resource("secrets").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	return int64(len(body)), nil
}

// parallel runs f(0..n-1) on concurrency goroutines and returns the first
// error.
func parallel(n, concurrency int, f func(int) error) error {
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range max(concurrency, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// watchListGate turns client-go's WatchListClient feature on or off (what
// the e2e tests do with clientfeaturestesting.SetFeatureDuringTest).
type watchListGate struct {
	clientfeatures.Gates
	on bool
}

func (g watchListGate) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.on
	}
	return g.Gates.Enabled(f)
}

func setFeatureWatchListClient(on bool) {
	clientfeatures.ReplaceFeatureGates(watchListGate{Gates: clientfeatures.FeatureGates(), on: on})
}

// countingRT counts the watch-list and LIST requests that go through it,
// the responses other than 200 by status, and bodies that broke off.
type countingRT struct {
	next              http.RoundTripper
	watchList, listed *atomic.Int64
	mu                *sync.Mutex
	statuses          map[string]int
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	switch {
	case q.Get("sendInitialEvents") == "true":
		c.watchList.Add(1)
	case r.Method == http.MethodGet && q.Get("watch") == "":
		c.listed.Add(1)
	}
	resp, err := c.next.RoundTrip(r)
	key := ""
	switch {
	case err != nil && r.Context().Err() == nil:
		key = "error: " + err.Error()
	case err == nil && resp.StatusCode != http.StatusOK:
		key = resp.Status
	}
	if key != "" {
		c.record(key)
	}
	if err == nil {
		// A stream that breaks mid-body makes the reflector retry: keep
		// why (the server's reset, a lost connection, ...).
		resp.Body = &errRecordingBody{ReadCloser: resp.Body, ctx: r.Context(), record: c.record}
	}
	return resp, err
}

func (c countingRT) record(key string) {
	c.mu.Lock()
	c.statuses[key]++
	c.mu.Unlock()
}

// errRecordingBody records the first read error of a body other than its
// end or the client's own cancellation.
type errRecordingBody struct {
	io.ReadCloser
	ctx    context.Context
	record func(string)
	failed bool
	closed atomic.Bool // the client closed it (a watcher stopped): its read errors are its own
}

func (b *errRecordingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !b.failed && b.ctx.Err() == nil && !b.closed.Load() {
		b.failed = true
		b.record("body read error: " + err.Error())
	}
	return n, err
}

func (b *errRecordingBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// rssSampler records the highest VmRSS of a process until stopped.
type rssSampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s.peak.Store(rss(pid))
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				if v := rss(pid); v > s.peak.Load() {
					s.peak.Store(v)
				}
			}
		}
	}()
	return s
}

func (s *rssSampler) Stop() uint64 {
	close(s.stop)
	<-s.done
	return s.peak.Load()
}

// resetHWM resets a process's VmHWM to its current RSS (Linux >= 4.0).
func resetHWM(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

func statusKB(pid int, field string) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.HasPrefix(line, []byte(field+":")) {
			f := bytes.Fields(line)
			kb, _ := strconv.ParseUint(string(f[1]), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// measureWatchList runs the watch-list clients against the server at base
// (process pid; apiPID is the apiserver's, the same when it is the server).
func measureWatchList(ctx context.Context, base *rest.Config, pid, apiPID int, ns string, wo *watchOptions) (watchListResult, error) {
	var res watchListResult
	var wl, listed atomic.Int64
	var statusMu sync.Mutex
	statuses := map[string]int{}
	defer func() {
		statusMu.Lock()
		defer statusMu.Unlock()
		if len(statuses) > 0 {
			fmt.Fprintf(os.Stderr, "bench: responses other than 200 OK, and broken bodies: %v\n", statuses)
		}
	}()
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return countingRT{next: rt, watchList: &wl, listed: &listed, mu: &statusMu, statuses: statuses}
	}
	if !wo.protobuf {
		cfg.ContentType = "application/json"
		cfg.AcceptContentTypes = "application/json"
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var syncFn func(ctx context.Context) error
	switch wo.client {
	case "informer":
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return res, err
		}
		syncFn = func(ctx context.Context) error { return informerSync(ctx, kc, ns) }
	case "raw":
		client, err := rest.HTTPClientFor(cfg)
		if err != nil {
			return res, err
		}
		url := cfg.Host + "/api/v1/namespaces/" + ns + "/secrets?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
		syncFn = func(ctx context.Context) error { return rawWatchListSync(ctx, client, url) }
	default:
		return res, fmt.Errorf("unknown -watchlist-client %q", wo.client)
	}

	time.Sleep(500 * time.Millisecond) // let the server settle
	idle := idleCPU(apiPID, 0)
	res.baseRSS = rss(pid)
	if err := resetHWM(pid); err != nil {
		fmt.Fprintln(os.Stderr, "bench: cannot reset VmHWM:", err)
	}
	sampler := sampleRSS(pid, wo.rssInterval)
	if wo.overBound != nil {
		go func() {
			for sampler.peak.Load() <= wo.boundBytes {
				select {
				case <-sampler.done:
					return
				case <-time.After(wo.rssInterval):
				}
			}
			wo.overBound(cfg)
		}()
	}
	cpu0, api0 := cpuTicks(pid), cpuTicks(apiPID)
	times := make([]time.Duration, wo.clients)
	errs := make([]error, wo.clients)
	var wg, synced sync.WaitGroup
	var syncedCount atomic.Int64
	startGate := make(chan struct{})
	start := time.Now()
	for i := range wo.clients {
		wg.Add(1)
		synced.Add(1)
		go func() {
			defer wg.Done()
			<-startGate
			// syncFn returns once synced and keeps its watch open (as an
			// informer does) until runCtx ends.
			errs[i] = syncFn(runCtx)
			times[i] = time.Since(start)
			if n := syncedCount.Add(1); n == int64(wo.clients/2) && wo.midRun != nil {
				go wo.midRun(cfg)
			}
			synced.Done()
		}()
	}
	start = time.Now()
	close(startGate)
	allDone := make(chan struct{})
	go func() { synced.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(wo.syncTimeout):
		fmt.Fprintf(os.Stderr, "bench: not all clients synced after %s\n", wo.syncTimeout)
	}
	// Keep sampling a little after the last sync: memory freed late still
	// counts as the run's.
	time.Sleep(time.Second)
	res.peakRSS = sampler.Stop()
	res.hwm = statusKB(pid, "VmHWM")
	res.cpuSec = float64(cpuTicks(pid)-cpu0) / clkTck
	res.apiAboveIdle = aboveIdle(cpuTicks(apiPID)-api0, idle, time.Since(start)) / 1000
	cancel()
	select {
	case <-allDone:
	case <-time.After(30 * time.Second):
	}
	var ok []float64
	var firstErr error
	for i := range wo.clients {
		if errs[i] == nil && times[i] > 0 {
			ok = append(ok, times[i].Seconds())
		} else if firstErr == nil && errs[i] != nil {
			firstErr = errs[i]
		}
	}
	if firstErr != nil {
		fmt.Fprintln(os.Stderr, "bench: a client failed:", firstErr)
	}
	res.synced = len(ok)
	if len(ok) > 0 {
		res.firstSync = time.Duration(pct(ok, 0) * float64(time.Second))
		res.p50Sync = time.Duration(pct(ok, 50) * float64(time.Second))
		res.allSync = time.Duration(pct(ok, 100) * float64(time.Second))
	}
	res.watchListReqs, res.listReqs = wl.Load(), listed.Load()
	wg.Wait()
	return res, nil
}

// informerSync runs a Secret informer of ns (its own factory, so its own
// reflector and watch) until it has synced; the informer keeps running
// until ctx ends. A transform drops the Secrets' data, so the bench
// process holds keys and metadata, not 64 copies of the data set.
func informerSync(ctx context.Context, kc kubernetes.Interface, ns string) error {
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns),
		informers.WithTransform(func(o any) (any, error) {
			if s, ok := o.(*corev1.Secret); ok {
				s.Data, s.StringData, s.ManagedFields = nil, nil, nil
			}
			return o, nil
		}))
	inf := f.Core().V1().Secrets().Informer()
	f.Start(ctx.Done())
	go func() { <-ctx.Done(); f.Shutdown() }()
	// cache.WaitForCacheSync polls every 100 ms: too coarse for a timing.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !inf.HasSynced() {
		select {
		case <-ctx.Done():
			return errors.New("informer did not sync")
		case <-t.C:
		}
	}
	return nil
}

// rawWatchListSync sends a watch-list request and reads it until the
// initial-events-end bookmark; then it keeps reading (discarding) until
// ctx ends.
func rawWatchListSync(ctx context.Context, client *http.Client, url string) error {
	resp, err := openGet(ctx, client, url)
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	if err := readToInitialEventsEnd(br); err != nil {
		resp.Body.Close()
		return err
	}
	go func() {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, br)
	}()
	return nil
}

// readEventHead reads one newline-framed JSON watch event and returns at
// most its first n bytes (the rest is discarded without being kept). Both
// servers frame JSON watch events one per line.
func readEventHead(br *bufio.Reader, n int) ([]byte, error) {
	var head []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(head) < n {
			head = append(head, chunk[:min(len(chunk), n-len(head))]...)
		}
		switch {
		case err == nil:
			return head, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return head, err
		}
	}
}

// ------------------------------------------------------------------ fanout

type watcherStats struct {
	events   atomic.Int64 // every event received
	timed    int64        // events carrying writtenAt
	hist     latencyCounts
	lastRecv time.Time
	err      error // why the stream ended before the bench stopped it
}

type fanoutResult struct {
	writes, dropped, failed int64
	writeP50, writeP99      time.Duration
	writeSpan               time.Duration
	established, ended      int
	events, timed           int64
	deliverSpan             time.Duration
	p50, p99, p999, maxLat  time.Duration
	cpuSec, apiCPUSec       float64
	// writeCPUMs, writeAPIMs: the server's and the apiserver's CPU over
	// the writes and writeTail, the window writerAlone measures too (the
	// whole-cost rows, wholecost.go).
	writeCPUMs, writeAPIMs float64
	peakRSS                uint64
	firstErr               error
}

func benchFanout(ctx context.Context, env *benchEnv, o options, wo *watchOptions) ([]row, []string, error) {
	const set = "fanout"
	ns := "bench-" + set
	if _, err := env.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"bench": set}}}, metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	for i := range wo.objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fanoutName(i)}, Data: map[string]string{"v": "0"}}
		if _, err := env.kc.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return nil, nil, err
		}
	}
	write := func(ctx context.Context, i int) error {
		_, err := env.kc.CoreV1().ConfigMaps(ns).Patch(ctx, fanoutName(i%wo.objects), types.MergePatchType, stampPatch(), metav1.PatchOptions{})
		return err
	}
	// The apiserver's CPU per write with nothing watching: what the
	// whole-cost rows subtract (wholecost.go).
	fmt.Fprintf(os.Stderr, "bench: fan-out: the writer alone, %d updates/s for %s\n", wo.rate, wo.baseline)
	perWrite, _, err := writerAlone(ctx, env.apiPID, wo.rate, wo.baseline, wo.writers, write)
	if err != nil {
		return nil, nil, err
	}
	t, err := startTier(ctx, env.cp, env.admin, o.binary, o.tierFlags, o.tierEnv, set, "configmaps", 0, o.freshness)
	if err != nil {
		return nil, nil, err
	}
	time.Sleep(2 * time.Second)
	fmt.Fprintf(os.Stderr, "bench: fan-out on the tier: %d watchers, %d updates/s for %s\n", wo.watchers, wo.rate, wo.duration)
	tierRes, err := measureFanout(ctx, env, t.cfg, t.pid, ns, wo, write)
	t.stop()
	if err != nil {
		return nil, nil, fmt.Errorf("tier: %w", err)
	}
	time.Sleep(2 * time.Second)
	fmt.Fprintf(os.Stderr, "bench: fan-out on the apiserver: %d watchers, %d updates/s for %s\n", wo.watchers, wo.rate, wo.duration)
	apiRes, err := measureFanout(ctx, env, env.admin, env.apiPID, ns, wo, write)
	if err != nil {
		return nil, nil, fmt.Errorf("apiserver: %w", err)
	}
	label := fmt.Sprintf("fan-out (%d watchers, %d updates/s, %s)", wo.watchers, wo.rate, wo.duration)
	a, b := apiRes, tierRes
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	rate := func(r fanoutResult) float64 {
		if r.deliverSpan <= 0 {
			return 0
		}
		return float64(r.timed) / r.deliverSpan.Seconds()
	}
	wrate := func(r fanoutResult) float64 {
		if r.writeSpan <= 0 {
			return 0
		}
		return float64(r.writes) / r.writeSpan.Seconds()
	}
	// perUpdate is CPU ms per successful write of r.
	perUpdate := func(cpuMs float64, r fanoutResult) float64 {
		if r.writes == 0 {
			return math.NaN()
		}
		return cpuMs / float64(r.writes)
	}
	nan := math.NaN()
	expected := func(r fanoutResult) float64 { return float64(r.writes) * float64(r.established) }
	share := func(r fanoutResult) float64 {
		if expected(r) == 0 {
			return 0
		}
		return 100 * float64(r.timed) / expected(r)
	}
	rows := []row{
		{label, "watchers established", "", float64(a.established), float64(b.established), ""},
		{label, "updates written (achieved rate)", "/s", wrate(a), wrate(b), ""},
		{label, "updates written", "", float64(a.writes), float64(b.writes), ""},
		{label, "write (PATCH to apiserver) p50, part of latency", "ms", msf(a.writeP50), msf(b.writeP50), ""},
		{label, "write (PATCH to apiserver) p99", "ms", msf(a.writeP99), msf(b.writeP99), ""},
		{label, "events delivered (updates x watchers)", "", float64(a.timed), float64(b.timed), ""},
		{label, "delivered / expected", "%", share(a), share(b), ""},
		{label, "delivered events/s", "/s", rate(a), rate(b), ""},
		{label, "delivery latency p50", "ms", msf(a.p50), msf(b.p50), ""},
		{label, "delivery latency p99", "ms", msf(a.p99), msf(b.p99), ""},
		{label, "delivery latency p99.9", "ms", msf(a.p999), msf(b.p999), ""},
		{label, "delivery latency max", "ms", msf(a.maxLat), msf(b.maxLat), ""},
		{label, "watchers ended early (e.g. slow)", "", float64(a.ended), float64(b.ended), ""},
		{label, "server CPU during writes+drain", "s", a.cpuSec, b.cpuSec, ""},
		{label, "kube-apiserver CPU in the same window", "s", a.apiCPUSec, b.apiCPUSec, ""},
		{label, "apiserver CPU per update, the writer alone (nothing watching)", "ms", perWrite, nan, ""},
		{label, "CPU per update: apiserver's dispatch (its run - writer alone) / tier's processes", "ms", perUpdate(a.writeAPIMs, a) - perWrite, perUpdate(b.writeCPUMs, b), ""},
		{label, "apiserver CPU per update the tier causes (its run - writer alone)", "ms", nan, perUpdate(b.writeAPIMs, b) - perWrite, ""},
		{label, "whole CPU per update: dispatch / tier + what it causes", "ms", perUpdate(a.writeAPIMs, a) - perWrite, perUpdate(b.writeCPUMs+b.writeAPIMs, b) - perWrite, ""},
		{label, "server peak RSS", "MiB", float64(a.peakRSS) / mib, float64(b.peakRSS) / mib, ""},
	}
	var notes []string
	if a.dropped+b.dropped+a.failed+b.failed > 0 {
		notes = append(notes, fmt.Sprintf("fan-out writer: ticks dropped (all writers busy) apiserver %d, tier %d; failed writes apiserver %d, tier %d", a.dropped, b.dropped, a.failed, b.failed))
	}
	for _, r := range []struct {
		name string
		res  fanoutResult
	}{{"apiserver", a}, {"tier", b}} {
		if r.res.firstErr != nil {
			notes = append(notes, fmt.Sprintf("fan-out %s: first early end of a watch: %v", r.name, r.res.firstErr))
		}
	}
	return rows, notes, nil
}

func fanoutName(i int) string { return fmt.Sprintf("fan-%04d", i) }

// fanoutTransports builds n independent HTTP/2-capable round trippers with
// cfg's TLS (client certificate) and auth wrappers: each is its own
// connection pool, so the watchers spread over at least n connections.
func fanoutTransports(cfg *rest.Config, n int) ([]*http.Client, error) {
	var out []*http.Client
	for range max(n, 1) {
		tlsConf, err := rest.TLSConfigFor(cfg)
		if err != nil {
			return nil, err
		}
		tr := &http.Transport{
			TLSClientConfig:     tlsConf,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		}
		rt, err := rest.HTTPWrappersForConfig(cfg, tr)
		if err != nil {
			return nil, err
		}
		out = append(out, &http.Client{Transport: rt})
	}
	return out, nil
}

func listRV(ctx context.Context, client *http.Client, url string) (string, error) {
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	err := getJSON(ctx, client, url, &l)
	return l.Metadata.ResourceVersion, err
}

func measureFanout(ctx context.Context, env *benchEnv, cfg *rest.Config, pid int, ns string, wo *watchOptions, write func(ctx context.Context, i int) error) (fanoutResult, error) {
	var res fanoutResult
	clients, err := fanoutTransports(cfg, wo.transports)
	if err != nil {
		return res, err
	}
	base := cfg.Host + "/api/v1/namespaces/" + ns + "/configmaps"
	rv, err := listRV(ctx, clients[0], base)
	if err != nil {
		return res, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	stats := make([]*watcherStats, wo.watchers)
	var established atomic.Int64
	var wg sync.WaitGroup
	url := base + "?watch=1&resourceVersion=" + rv
	for i := range wo.watchers {
		st := &watcherStats{}
		stats[i] = st
		wg.Add(1)
		go func(client *http.Client) {
			defer wg.Done()
			st.err = fanoutWatch(watchCtx, client, url, st, &established)
			if watchCtx.Err() != nil {
				st.err = nil
			}
		}(clients[i%len(clients)])
	}
	deadline := time.Now().Add(3 * time.Minute)
	for int(established.Load()) < wo.watchers && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	res.established = int(established.Load())
	fmt.Fprintf(os.Stderr, "bench: %d/%d watches established\n", res.established, wo.watchers)
	time.Sleep(time.Second)

	sampler := sampleRSS(pid, 100*time.Millisecond)
	cpu0, apiCPU0 := cpuTicks(pid), cpuTicks(env.apiPID)
	writeStart := time.Now()
	w := writeLoop(ctx, wo.rate, wo.duration, wo.writers, write)
	res.writes, res.dropped, res.failed = w.writes, w.dropped, w.failed
	res.writeP50 = time.Duration(pct(w.lat, 50) * float64(time.Millisecond))
	res.writeP99 = time.Duration(pct(w.lat, 99) * float64(time.Millisecond))
	res.writeSpan = time.Since(writeStart)
	time.Sleep(writeTail)
	res.writeCPUMs, res.writeAPIMs = ticksMs(cpuTicks(pid)-cpu0), ticksMs(cpuTicks(env.apiPID)-apiCPU0)

	// Drain: until every established watcher saw every write, nothing
	// arrived for 2 s, or -drain passed.
	expected := res.writes * int64(res.established)
	drainUntil(wo.drain, 2*time.Second, func() (got, want int64) {
		for _, st := range stats {
			got += st.events.Load()
		}
		return got, expected
	})
	res.cpuSec = float64(cpuTicks(pid)-cpu0) / clkTck
	res.apiCPUSec = float64(cpuTicks(env.apiPID)-apiCPU0) / clkTck
	res.peakRSS = sampler.Stop()
	stopWatch()
	wg.Wait()

	var lat latencies
	var last time.Time
	for _, st := range stats {
		res.events += st.events.Load()
		res.timed += st.timed
		lat.add(&st.hist)
		if st.lastRecv.After(last) {
			last = st.lastRecv
		}
		if st.err != nil {
			res.ended++
			if res.firstErr == nil {
				res.firstErr = st.err
			}
		}
	}
	if !last.IsZero() {
		res.deliverSpan = last.Sub(writeStart)
	}
	res.p50, res.p99, res.p999, res.maxLat = lat.quantile(0.50), lat.quantile(0.99), lat.quantile(0.999), lat.max()
	return res, nil
}

// fanoutWatch opens one watch and records every event until the stream
// ends or ctx is cancelled.
func fanoutWatch(ctx context.Context, client *http.Client, url string, st *watcherStats, established *atomic.Int64) error {
	resp, err := openGet(ctx, client, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	established.Add(1)
	events := newEventReader(resp.Body)
	for {
		ev, err := events.next()
		if err != nil {
			return err
		}
		now := time.Now()
		st.events.Add(1)
		st.lastRecv = now
		if err := errorEvent(ev); err != nil {
			return err
		}
		if ts, ok := stampOf(ev); ok {
			st.timed++
			st.hist.record(now, ts)
		}
	}
}

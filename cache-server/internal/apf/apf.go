// Package apf puts kube-apiserver's API Priority and Fairness in front of
// the tier (standalone and a fleet's fronts; shards serve only fronts).
//
// Why: the tier is a shared service with no admission control of its
// own. One client looping full LISTs, or opening hundreds of watch-lists,
// would take every core while kubelets, controllers and people wait.
// Requests reaching the tier through the aggregator were charged by
// kube-apiserver's APF only until they were handed over (the aggregator
// calls RequestDelegated), so the tier must protect itself, as every
// aggregated server built on k8s.io/apiserver's RecommendedOptions does.
//
// It is k8s.io/apiserver's own implementation, not a copy: the config
// controller (utilflowcontrol.New) reads the cluster's FlowSchemas and
// PriorityLevelConfigurations with list/watch informers, so the tier
// isolates the flows the apiserver isolates (system:nodes, leader
// election, workload-high/low, global-default, catch-all), and the filter
// (filters.WithPriorityAndFairness) queues, dispatches and rejects with
// the apiserver's 429 and Retry-After. The chain puts it where
// DefaultBuildHandlerChain does: after authentication and impersonation,
// before authorization (package auth). What the tier does differs from
// the apiserver in one place, the work estimate (estimate.go): a LIST is
// charged by what the tier walks and holds, not by the resource's count.
//
// The config controller also writes FlowSchemas' Dangling condition
// (server-side apply on flowschemas/status as
// api-priority-and-fairness-config-consumer-v1). The tier's ServiceAccount
// is deliberately not granted that write: kube-apiserver runs the same
// controller with the same rule and writes the same condition, so the
// tier would only race it; a read-only cache should not write cluster
// objects. See docs/priority-and-fairness.md for what the denial costs
// (at most a log line and a backed-off retry per FlowSchema change that
// the tier sees before the apiserver's own status write).
package apf

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/endpoints/request"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"
	fcmetrics "k8s.io/apiserver/pkg/util/flowcontrol/metrics"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
)

// RequestWaitLimit is how long a request may wait in its queue before it
// is rejected: kube-apiserver's --request-timeout (60 s) / 4, what
// DefaultBuildHandlerChain passes (a request without a deadline, as the
// tier's are, waits this long).
const RequestWaitLimit = 15 * time.Second

// syncWarning is how long the cluster's configuration may take to load
// before the tier says, once, that it serves on the mandatory levels.
const syncWarning = 30 * time.Second

// Coster tells what a request costs (front.Server.Cost).
type Coster interface {
	Cost(r *http.Request, info *request.RequestInfo) front.Cost
}

// Options configure priority and fairness.
type Options struct {
	// Client reads the configuration (list/watch FlowSchemas and
	// PriorityLevelConfigurations) and is what the config controller
	// would write FlowSchema status with (see the package comment).
	Client kubernetes.Interface
	// ServerConcurrencyLimit is the seats shared among priority levels
	// (ServerConcurrencyLimit in concurrency.go).
	ServerConcurrencyLimit int
	// Costs estimates requests' work (front.Server).
	Costs Coster
	// Cores is the CPU the seats stand for (ProcessConcurrencyLimit); 0:
	// SeatsPerCore seats per core.
	Cores float64
	// Learner learns how long a core takes for a seat's worth of a
	// LIST's work (estimate.go) from the requests executed; nil:
	// seatcpu.Default.
	Learner *seatcpu.Learner
	// SeatCPU, when set, is that time, fixed (tests).
	SeatCPU time.Duration
	// ConfigSynced, when set, is 1 once the configuration was read.
	ConfigSynced prometheus.Gauge
	// Lingering, when set, counts by priority_level the seat-seconds
	// executed requests held after they ended (estimate.go).
	Lingering *prometheus.CounterVec
	// BulkNice, when set, is the nice value at which requests of
	// BulkWork or more run their work (package bulkthread).
	BulkNice int
	Log      logr.Logger
}

// BulkWork is the work (package seatcpu: 1,000 objects walked or 1 MiB
// written) from which a request is bulk work: a LIST or watch-list whose
// seats come from its size, not the minimum of 1. A kubelet's LIST of
// its node's Pods, an indexed read, walks tens of objects.
const BulkWork = 1

// APF is the tier's priority and fairness.
type APF struct {
	opts    Options
	factory informers.SharedInformerFactory
	ctl     utilflowcontrol.Interface
}

// New builds the controller; Start runs it and Filter installs it.
func New(opts Options) *APF {
	// The library's metrics live in component-base's legacy registry,
	// registered once per process; Gatherer serves them.
	fcmetrics.Register()
	// Only the two flowcontrol informers are started from this factory
	// (the controller asks for them in New).
	factory := informers.NewSharedInformerFactory(opts.Client, 0)
	return &APF{
		opts:    opts,
		factory: factory,
		ctl:     utilflowcontrol.New(factory, opts.Client.FlowcontrolV1(), opts.ServerConcurrencyLimit),
	}
}

// Start reads the configuration and runs the controller until ctx ends.
// Requests are served from the start: until the configuration is read
// they are classified by the mandatory exempt and catch-all levels the
// controller begins with (the catch-all then has every seat).
func (a *APF) Start(ctx context.Context) {
	if a.opts.ConfigSynced != nil {
		a.opts.ConfigSynced.Set(0)
	}
	a.factory.Start(ctx.Done())
	go func() {
		if err := a.ctl.Run(ctx.Done()); err != nil && ctx.Err() == nil {
			a.opts.Log.Error(err, "priority and fairness config controller stopped")
		}
	}()
	genericfilters.StartPriorityAndFairnessWatermarkMaintenance(ctx.Done())
	go a.reportSync(ctx)
	a.opts.Log.Info("priority and fairness", "serverConcurrencyLimit", a.opts.ServerConcurrencyLimit, "seatsPerCore", a.seatsPerCore())
}

// reportSync logs and exports when the configuration has been read, and
// says once, loudly, if it takes long: without list and watch on
// flowschemas and prioritylevelconfigurations the tier never isolates
// flows.
func (a *APF) reportSync(ctx context.Context) {
	synced := func() bool {
		for _, ok := range a.factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return false
			}
		}
		return true
	}
	done := make(chan bool, 1)
	go func() { done <- synced() }()
	select {
	case ok := <-done:
		a.synced(ok)
		return
	case <-time.After(syncWarning):
		a.opts.Log.Error(nil, "priority and fairness has not read the cluster's FlowSchemas and PriorityLevelConfigurations: requests are classified by the mandatory catch-all level until it does; the tier's ServiceAccount needs list and watch on flowschemas and prioritylevelconfigurations (flowcontrol.apiserver.k8s.io)", "after", syncWarning)
	case <-ctx.Done():
		return
	}
	a.synced(<-done)
}

func (a *APF) synced(ok bool) {
	if !ok {
		return // ctx ended
	}
	if a.opts.ConfigSynced != nil {
		a.opts.ConfigSynced.Set(1)
	}
	a.opts.Log.Info("priority and fairness configuration read from the cluster")
}

// Run builds priority and fairness for a tier whose profile sets
// spec.serverConcurrencyLimit to spec (nil: from the CPU) and starts it
// until ctx ends.
func Run(ctx context.Context, client kubernetes.Interface, spec *int32, costs Coster, learner *seatcpu.Learner, synced prometheus.Gauge, lingering *prometheus.CounterVec, bulkNice int, log logr.Logger) *APF {
	limit, cores, err := ProcessConcurrencyLimit(spec)
	if err != nil {
		log.Error(err, "reading the cgroup CPU limit; the concurrency limit is sized from GOMAXPROCS")
	}
	a := New(Options{Client: client, ServerConcurrencyLimit: limit, Cores: cores, Costs: costs, Learner: learner, ConfigSynced: synced, Lingering: lingering, BulkNice: bulkNice, Log: log.WithName("apf")})
	a.Start(ctx)
	return a
}

// Filter puts handler behind priority and fairness. It needs the
// request's RequestInfo and user in the context (after authentication).
func (a *APF) Filter(handler http.Handler) http.Handler {
	// Every long-running request of the tier is a watch, which the filter
	// handles itself (seats held until the watch is initialized).
	longRunning := request.LongRunningRequestCheck(func(_ *http.Request, ri *request.RequestInfo) bool {
		return ri != nil && ri.Verb == "watch"
	})
	executed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The work is counted as it starts: a LIST's CPU is spent in
		// the next milliseconds, a watch-list's before its bookmark, and
		// the watch may stay open for minutes (package seatcpu matches
		// CPU and work by the 5 s window).
		kind, work := noteExecuted(r)
		a.opts.Learner.Did(kind, work)
		if a.opts.BulkNice > 0 && work >= BulkWork {
			// The handler runs its bulk work at the lowered priority
			// (package bulkthread): a LIST all of it, a watch-list its
			// initial events.
			r = r.WithContext(bulkthread.WithBulk(r.Context(), a.opts.BulkNice))
		}
		handler.ServeHTTP(w, r)
	})
	filtered := genericfilters.WithPriorityAndFairness(executed, longRunning, a.ctl, a.estimator(), RequestWaitLimit)
	rejections := newRejectLog(a.opts.Log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, c := withClassified(r)
		filtered.ServeHTTP(w, r)
		if rejected, fs, pl := c.rejected(); rejected {
			rejections.rejected(r, fs, pl)
		}
		if pl, seatSeconds := c.lingered(); pl != "" && a.opts.Lingering != nil {
			// Every executed request adds, 0 for most: a level's series
			// exists once it served anything.
			a.opts.Lingering.WithLabelValues(pl).Add(seatSeconds)
		}
	})
}

// Package seatcpu learns how long this process's cores take for a seat's
// worth of a read's work (Work: 1,000 objects walked or 1 MiB written),
// from the process's own CPU time.
//
// Why: priority and fairness charges a LIST's seats after it ends for
// the rest of the core it ran on (apf, estimate.go), which needs the
// LIST's CPU time. A constant measured on one machine is wrong elsewhere:
// faster cores make LISTs linger longer than they ran, and a fleet's
// front spends a fraction of a full LIST's CPU itself while its shards
// spend the rest (14–18 ms across a fleet on this project's machine for
// the LIST a standalone tier serves in ~2 ms; docs/benchmarks.md). So
// every process learns its own cost per unit of work, and a shard sends
// its cost to the fronts with its sizes (shardwire.Header.SeatCPU), which
// charge their LISTs for their own CPU and the shards' together.
//
// How: every Window the learner reads the process's CPU time
// (getrusage) and the work it did (Did, as each LIST and watch-list
// starts). A process also spends CPU beside its reads — ingesting the
// watch stream, dispatching events, GETs, garbage collection of the
// stored objects — so windows with almost no reads give that base rate,
// and windows with many reads give the cost per
// unit as (CPU rate − base) / work rate, smoothed and bounded — per kind
// of read (Kind: LISTs and watch-lists), each learned in the windows it
// dominates (90% of its reads or more), together in the others. Between
// floods the estimate stays where the last one left it.
package seatcpu

import (
	"context"
	"math"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// A seat's worth of a read's work.
const (
	WalkedPerSeat = 1000
	BytesPerSeat  = 1 << 20
)

// Work is a read's work in seats' worth: walked objects (a selector is
// evaluated on each) and written bytes (copied, usually gzipped).
func Work(walked, bytes int64) float64 {
	return float64(walked)/WalkedPerSeat + float64(bytes)/BytesPerSeat
}

// Default is the cost a process starts with: the standalone tier on this
// project's 2-core machine served 467 full LISTs of 10,000 1 KiB
// ConfigMaps a second (24 seats' worth each) with a core, 2.1 ms each,
// TLS, HTTP/2 and garbage collection included (docs/benchmarks.md, the
// floods).
const Default = 100 * time.Microsecond

// The estimate's bounds: a tenth of Default (a fast core, or a read's
// bytes served from the gzip chunk cache) to twenty times it (a slow or
// throttled core). A learned value outside them says more about the
// windows than about the reads.
const (
	Min = Default / 10
	Max = Default * 20
)

const (
	// Window is how often the learner reads the process's CPU time.
	Window = 5 * time.Second
	// baseCores: a window whose reads took less than this many cores at
	// Default (50 seats' worth a second, two full LISTs of 10,000
	// objects) measures the base rate. An absolute rate, not a share of
	// the CPU at the current estimate: an estimate far below the truth
	// would make a flood look like a small share and be taken for base.
	baseCores = 0.005
	// learnCores: a window learns the cost per unit only when its reads
	// took at least this many cores at Default — enough reads that the
	// base's error is small beside them (500 seats' worth a second, ~20
	// full LISTs of 10,000 objects). Windows in between change nothing.
	learnCores = 0.05
	// dominant: a window teaches a kind its own cost only when that kind
	// did this share of its reads (in seats' worth) or more. The other
	// kinds' reads are charged at their current cost, which may be far
	// off — at the start of the first flood of a kind it is still
	// Default: the window where a LIST flood handed over to a watch-list
	// flood put the LISTs' cost at 370 µs, three times their own. A
	// window no kind dominates (the handover, or LISTs and watch-lists
	// flooding together) moves the costs of the kinds that did enough
	// reads by one factor, what the window's CPU says of them together:
	// their ratio stays, and a mixed flood still teaches the level.
	dominant = 0.9
	// smoothing is the weight of a window's measurement: the estimate
	// follows a change within a few windows and one odd window moves it
	// half way at most.
	smoothing = 0.5
)

// Kind is a kind of read work, whose CPU per seat's worth is learned
// apart: a watch-list writes every object as an event of its own where a
// LIST writes one body, often gzipped chunks kept from an earlier LIST —
// the standalone tier on this project's machine took 113–156 µs a seat
// for LISTs and 427–499 µs for watch-lists (docs/benchmarks.md). With
// one value, each flood of the other kind started at the wrong cost and
// took four windows (20 s) to reach its own.
type Kind int

const (
	// List: a LIST's body, and a shard's list for a front.
	List Kind = iota
	// WatchList: a watch-list's initial events.
	WatchList
	kinds
)

func (k Kind) String() string {
	if k == WatchList {
		return "watch-list"
	}
	return "list"
}

// Reads is a window's reads by kind, in seats' worth.
type Reads [kinds]float64

// Estimate is what the learner knows.
type Estimate struct {
	// SeatCPU is the CPU time a seat's worth of work takes, by kind.
	SeatCPU [kinds]time.Duration
	// Base is the cores the process spends beside its reads; BaseKnown
	// once a window measured it (until then all CPU is the reads').
	Base      float64
	BaseKnown bool
}

// Next is e after a window of dt in which the process used cpu and did
// work. A kind is learned in a window where it alone did enough reads and
// nearly all of them (dominant): its cost is what is left of the CPU
// after the base and the other kind's few reads at their current cost.
// In a window no kind dominates, the kinds that did enough reads are
// scaled together.
func (e Estimate) Next(cpu time.Duration, work Reads, dt time.Duration) Estimate {
	if dt <= 0 || cpu < 0 {
		return e
	}
	var rate [kinds]float64
	readCores := 0.0
	for k, w := range work {
		if w < 0 {
			return e
		}
		rate[k] = w / dt.Seconds()
		readCores += rate[k] * Default.Seconds()
	}
	cores := cpu.Seconds() / dt.Seconds()
	if readCores < baseCores {
		if !e.BaseKnown {
			e.Base, e.BaseKnown = cores, true
		} else {
			e.Base += smoothing * (cores - e.Base)
		}
		return e
	}
	total, predicted := 0.0, 0.0
	for k, r := range rate {
		total += r
		predicted += r * e.SeatCPU[k].Seconds()
	}
	next := e
	for k := range rate {
		if rate[k]*Default.Seconds() < learnCores || rate[k] < dominant*total {
			continue
		}
		others := predicted - rate[k]*e.SeatCPU[k].Seconds()
		measured := time.Duration((cores - e.Base - others) / rate[k] * float64(time.Second))
		next.SeatCPU[k] = toward(e.SeatCPU[k], measured)
		return next
	}
	// No kind did nearly all the reads: one factor for those that did
	// enough.
	if predicted <= 0 {
		return e
	}
	f := (cores - e.Base) / predicted
	for k := range rate {
		if rate[k]*Default.Seconds() >= learnCores {
			next.SeatCPU[k] = toward(e.SeatCPU[k], time.Duration(f*float64(e.SeatCPU[k])))
		}
	}
	return next
}

// toward moves an estimate half way to a window's measurement, bounded.
func toward(est, measured time.Duration) time.Duration {
	measured = min(max(measured, Min), Max)
	return est + time.Duration(smoothing*float64(measured-est))
}

// Learner learns the process's Estimate while it runs (Run).
type Learner struct {
	// work is the seats' worth of reads done, in thousandths, by kind.
	work    [kinds]atomic.Uint64
	seatCPU [kinds]atomic.Int64
	// cpu is the process's CPU time so far.
	cpu    func() (time.Duration, error)
	window time.Duration
	gauge  *prometheus.GaugeVec // kind
	log    logr.Logger
}

// New returns a learner starting at Default for every kind; gauge
// (optional, labelled kind) exports its SeatCPU.
func New(gauge *prometheus.GaugeVec, log logr.Logger) *Learner {
	l := &Learner{cpu: processCPU, window: Window, gauge: gauge, log: log}
	for k := range kinds {
		l.set(k, Default)
	}
	return l
}

// Did counts work seats' worth of a read of kind k served.
func (l *Learner) Did(k Kind, work float64) {
	if l != nil && work > 0 {
		l.work[k].Add(uint64(math.Round(work * 1000)))
	}
}

// Work is the seats' worth of reads of kind k counted so far.
func (l *Learner) Work(k Kind) float64 { return float64(l.work[k].Load()) / 1000 }

// SeatCPU is the current estimate for kind k (Default for a nil learner).
func (l *Learner) SeatCPU(k Kind) time.Duration {
	if l == nil {
		return Default
	}
	return time.Duration(l.seatCPU[k].Load())
}

func (l *Learner) set(k Kind, d time.Duration) {
	l.seatCPU[k].Store(int64(d))
	if l.gauge != nil {
		l.gauge.WithLabelValues(k.String()).Set(d.Seconds())
	}
}

// worked is the work counted so far, by kind.
func (l *Learner) worked() [kinds]uint64 {
	var w [kinds]uint64
	for k := range w {
		w[k] = l.work[k].Load()
	}
	return w
}

// Run learns every Window until ctx ends. It logs when a kind's estimate
// has moved by a quarter since it last logged.
func (l *Learner) Run(ctx context.Context) {
	var e Estimate
	for k := range kinds {
		e.SeatCPU[k] = l.SeatCPU(k)
	}
	logged := e.SeatCPU
	cpu0, err := l.cpu()
	if err != nil {
		l.log.Error(err, "reading the process's CPU time; LISTs are charged the default CPU per seat", "seatCPU", Default)
		return
	}
	work0, t0 := l.worked(), time.Now()
	tick := time.NewTicker(l.window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cpu, err := l.cpu()
		if err != nil {
			continue
		}
		work, now := l.worked(), time.Now()
		var did Reads
		for k := range did {
			did[k] = float64(work[k]-work0[k]) / 1000
		}
		e = e.Next(cpu-cpu0, did, now.Sub(t0))
		cpu0, work0, t0 = cpu, work, now
		for k := range kinds {
			l.set(k, e.SeatCPU[k])
			if d := float64(e.SeatCPU[k] - logged[k]); math.Abs(d) >= 0.25*float64(logged[k]) {
				l.log.Info("CPU per seat of read work learned", "kind", k.String(), "seatCPU", e.SeatCPU[k], "baseCores", e.Base, "was", logged[k])
				logged[k] = e.SeatCPU[k]
			}
		}
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

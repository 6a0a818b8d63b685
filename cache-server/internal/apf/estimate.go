package apf

import (
	"math"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
	fcrequest "k8s.io/apiserver/pkg/util/flowcontrol/request"

	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
)

// The work estimate: how many seats a request occupies while it executes.
// APF's fairness is in seat-seconds, so a request's duration is already
// charged; its width (seats) is what it takes of the server at once.
//
// kube-apiserver's estimator charges a LIST served from its watch cache
// by the resource's total object count (or size), whatever the request
// walks. The tier knows what it walks and holds (front.Server.Cost):
//
//   - CPU: every walked object has a selector evaluated on its stored
//     fields (~0.1–0.5 µs), every written byte is copied and usually
//     gzipped (~1 ms per MiB); a seat is charged per walkedPerSeat objects
//     plus per bytesPerSeat written, so a kubelet's LIST of its node's
//     pods through the index, or a namespace's LIST, costs a seat where
//     a full LIST of a large resource costs many;
//   - memory: what a response is charged for holding (front.Cost.Held:
//     a fleet front's page; the protobuf, metadata-only and Table forms,
//     streamed now but still charged for their encoding work), per
//     heldBytesPerSeat as kube-apiserver's size-based estimate charges
//     memory (100 KB per seat);
//   - a watch-list costs its LIST's CPU and holds its seats until its
//     initial-events-end bookmark (front calls
//     utilflowcontrol.WatchInitialized there); a plain watch holds one
//     seat until it is established.
//
// Unlike kube-apiserver, the estimate is not clamped to the priority
// level's "max seats" (15% of its concurrency, at most its concurrency
// over its hand size), only to maxSeatsLimit. On a tier of a few cores
// that clamp is one seat in most levels — global-default gets 9 of 100
// seats, so at most 1 per request — which turned the estimate off: a
// flooder's full LISTs of a 16 MiB resource ran dozens at a time on two
// cores (cache-server/e2e/flood). A request wider than its level's
// concurrency is dispatched by the queue set when the level has nothing
// else executing (queueset canAccommodateSeatsLocked), so it still runs,
// alone, and the requests of other flows with earlier virtual finish
// times go first.
const (
	heldBytesPerSeat = 100_000
	// maxSeatsLimit is kube-apiserver's MaximumListSeatsLimit (with
	// SizeBasedListCostEstimate, on by default since 1.34).
	maxSeatsLimit = 100
)

// Seats is the width of a request of cost c.
func Seats(c front.Cost) uint64 {
	var seats uint64 = 1
	switch c.Kind {
	case front.CostList, front.CostWatchList:
		cpu := math.Ceil(cpuWork(c))
		mem := math.Ceil(float64(c.Held) / heldBytesPerSeat)
		seats = uint64(max(cpu, mem, 1))
	}
	return min(seats, maxSeatsLimit)
}

// cpuWork is the CPU a LIST or watch-list of cost c takes, in seats'
// worth of work (seatcpu.Work: 1,000 objects walked or 1 MiB written
// each).
func cpuWork(c front.Cost) float64 { return seatcpu.Work(c.Walked, c.Bytes) }

// The seats a request holds after it ends (the work estimate's
// FinalSeats for AdditionalLatency, what kube-apiserver charges a write
// for its watch fan-out; the queue set keeps them in use, and in the
// level's virtual time, for that long after the response is complete,
// so the client does not wait for them):
//
// A seat is a share of the server's cores: serverConcurrencyLimit seats
// stand for the pod's cores, SeatsPerCore each by default. A LIST is
// one goroutine's work, and on a core of its own it runs at a whole
// core: a full LIST of 10,000 ConfigMaps, charged 24 seats, ran at 50
// seats' worth of CPU for its 2.4 ms. The charge was only honest when
// the cores were shared with 25 other such LISTs; a level that ran
// such LISTs back to back — a single flooder in global-default, 9
// nominal seats on a 2-core tier — took a core or more whatever its
// share, and the other levels' requests (a kubelet's LIST, a
// controller's GET) waited for the CPU their seats promised (issue 21,
// docs/benchmarks.md). Charging the rest of that core's seat-seconds
// after the LIST ends — its seats for (seatsPerCore/seats − 1) times
// its CPU time — makes a level's seats bound its CPU: a level whose
// limit is C seats runs LISTs back to back at C/seatsPerCore cores.
// KEP-1040 describes this "additional latency" for requests wider than
// their level can hold (the queue set's own TODO); here it is what a
// request beyond its width costs in CPU.
//
// Only LISTs and watch-lists linger: their CPU is what the estimate
// knows (the objects walked and bytes written), and a short request's
// linger is a fraction of a millisecond. A request as wide as a core
// (seatsPerCore seats or more) already pays for it; one the queue set
// runs alone because it is wider than its level's current limit is
// dispatched when nothing else of the level executes, lingering seats
// or not (queueset canAccommodateSeatsLocked), so it does not wait for
// them (docs/priority-and-fairness.md).

// Linger is how long a request of cost c, seats wide, keeps its seats
// after it ends on a server of seatsPerCore seats per core whose core
// does a seat's worth of work in seatCPU (package seatcpu learns it), and
// whose shards, for a fleet's front, in c.ShardSeatCPU more: a front's
// seats stand for the fleet's CPU its requests take, its own and the
// shards' that serve them.
func Linger(c front.Cost, seats uint64, seatCPU time.Duration, seatsPerCore float64) time.Duration {
	if c.Kind != front.CostList && c.Kind != front.CostWatchList {
		return 0
	}
	if seats == 0 || float64(seats) >= seatsPerCore {
		return 0
	}
	busy := cpuWork(c) * float64(seatCPU+c.ShardSeatCPU)
	return time.Duration(busy * (seatsPerCore/float64(seats) - 1))
}

// Estimate is the work estimate of a request of cost c (Seats and
// Linger).
func Estimate(c front.Cost, seatCPU time.Duration, seatsPerCore float64) fcrequest.WorkEstimate {
	seats := Seats(c)
	we := fcrequest.WorkEstimate{InitialSeats: seats}
	if linger := Linger(c, seats, seatCPU, seatsPerCore); linger > 0 {
		we.FinalSeats, we.AdditionalLatency = seats, linger
	}
	return we
}

// estimator is the filter's WorkEstimatorFunc: at the fixed SeatCPU
// when set, else at what the learner has learned for the request's kind
// (seatcpu.Default without one).
func (a *APF) estimator() fcrequest.WorkEstimatorFunc {
	seatCPU := a.opts.Learner.SeatCPU
	if a.opts.SeatCPU > 0 {
		seatCPU = func(seatcpu.Kind) time.Duration { return a.opts.SeatCPU }
	}
	return Estimator(a.opts.Costs, seatCPU, a.seatsPerCore())
}

// workKind is the learner's kind of a LIST's or watch-list's work.
func workKind(c front.Cost) seatcpu.Kind {
	if c.Kind == front.CostWatchList {
		return seatcpu.WatchList
	}
	return seatcpu.List
}

// seatsPerCore is the server's seats over the cores they stand for.
func (a *APF) seatsPerCore() float64 {
	if a.opts.Cores <= 0 {
		return SeatsPerCore
	}
	return float64(a.opts.ServerConcurrencyLimit) / a.opts.Cores
}

// Estimator returns the work estimator over costs (Estimate at
// seatCPU's current value for the request's kind). It notes on the
// request its level, the seat-seconds it lingers and the work a LIST or
// watch-list does, which the filter counts for the learner as the
// request starts executing.
func Estimator(costs Coster, seatCPU func(seatcpu.Kind) time.Duration, seatsPerCore float64) fcrequest.WorkEstimatorFunc {
	return func(r *http.Request, flowSchema, priorityLevel string) fcrequest.WorkEstimate {
		info, _ := request.RequestInfoFrom(r.Context())
		c := costs.Cost(r, info)
		kind := workKind(c)
		we := Estimate(c, seatCPU(kind), seatsPerCore)
		var work float64
		if c.Kind == front.CostList || c.Kind == front.CostWatchList {
			work = cpuWork(c)
		}
		noteClassified(r, flowSchema, priorityLevel, float64(we.FinalSeats)*we.AdditionalLatency.Seconds(), kind, work)
		return we
	}
}

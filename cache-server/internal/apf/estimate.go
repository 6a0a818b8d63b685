package apf

import (
	"math"
	"net/http"

	"k8s.io/apiserver/pkg/endpoints/request"
	fcrequest "k8s.io/apiserver/pkg/util/flowcontrol/request"

	"github.com/cachetier/cachetier/cache-server/internal/front"
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
	walkedPerSeat    = 1000
	bytesPerSeat     = 1 << 20
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
		cpu := math.Ceil(float64(c.Walked)/walkedPerSeat + float64(c.Bytes)/bytesPerSeat)
		mem := math.Ceil(float64(c.Held) / heldBytesPerSeat)
		seats = uint64(max(cpu, mem, 1))
	}
	return min(seats, maxSeatsLimit)
}

// estimator is the filter's WorkEstimatorFunc.
func (a *APF) estimator() fcrequest.WorkEstimatorFunc {
	return Estimator(a.opts.Costs)
}

// Estimator returns the work estimator over costs.
func Estimator(costs Coster) fcrequest.WorkEstimatorFunc {
	return func(r *http.Request, flowSchema, priorityLevel string) fcrequest.WorkEstimate {
		noteClassified(r, flowSchema, priorityLevel)
		info, _ := request.RequestInfoFrom(r.Context())
		return fcrequest.WorkEstimate{InitialSeats: Seats(costs.Cost(r, info))}
	}
}

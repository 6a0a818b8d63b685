package apf

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/front"
	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
)

// TestSeats: the width of each kind of work, at most maxSeatsLimit.
func TestSeats(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    front.Cost
		want uint64
	}{
		{"not a read", front.Cost{Kind: front.CostOther}, 1},
		{"a GET", front.Cost{Kind: front.CostGet, Walked: 1, Returned: 1, Bytes: 5000}, 1},
		{"a plain watch", front.Cost{Kind: front.CostWatch}, 1},
		{"a node's pods", front.Cost{Kind: front.CostList, Walked: 110, Returned: 110, Bytes: 110 * 6000}, 1},
		{"10k ConfigMaps, streamed", front.Cost{Kind: front.CostList, Walked: 10_000, Returned: 10_000, Bytes: 14 << 20}, 24},
		{"a million objects: the limit", front.Cost{Kind: front.CostList, Walked: 1_000_000, Returned: 1_000_000, Bytes: 2 << 30}, maxSeatsLimit},
		{"a watch-list of the same", front.Cost{Kind: front.CostWatchList, Walked: 10_000, Returned: 10_000, Bytes: 14 << 20}, 24},
		{"a page of 500", front.Cost{Kind: front.CostList, Walked: 500, Returned: 500, Bytes: 700_000}, 2},
		{"a Table held whole", front.Cost{Kind: front.CostList, Walked: 1000, Returned: 1000, Bytes: 1 << 20, Held: 5 << 20}, 53},
		{"an empty LIST", front.Cost{Kind: front.CostList}, 1},
	} {
		if got := Seats(tc.c); got != tc.want {
			t.Errorf("%s: %d seats, want %d", tc.name, got, tc.want)
		}
	}
}

// TestLinger: a LIST keeps its seats after it ends for the rest of the
// core it ran on, in seat-seconds; nothing else lingers, nor a request
// as wide as a core.
func TestLinger(t *testing.T) {
	const seatCPU = 100 * time.Microsecond
	full := front.Cost{Kind: front.CostList, Walked: 10_000, Returned: 10_000, Bytes: 14 << 20}
	for _, tc := range []struct {
		name         string
		c            front.Cost
		seatsPerCore float64
		want         time.Duration
	}{
		// 24 seats' worth of work: 2.4 ms of a core, 50 seats' worth of
		// it; 24 seats were charged while it ran, the other 26 × 2.4 ms
		// are charged as 24 seats for 2.6 ms.
		{"10k ConfigMaps", full, 50, 2600 * time.Microsecond},
		{"the same watch-list", front.Cost{Kind: front.CostWatchList, Walked: 10_000, Returned: 10_000, Bytes: 14 << 20}, 50, 2600 * time.Microsecond},
		// More seats a core (a limit set above the default): more linger.
		{"10k ConfigMaps, 300 seats a core", full, 300, 27600 * time.Microsecond},
		// A node's 110 pods: 0.74 seats' worth, one seat charged; 49 ×
		// 73.9 µs.
		{"a node's pods", front.Cost{Kind: front.CostList, Walked: 110, Returned: 110, Bytes: 110 * 6000}, 50, 3623182 * time.Nanosecond},
		// A fleet's front: its shards' CPU (300 µs a seat's worth) on
		// top of its own, 24 × 400 µs, 26 × 9.6 ms after as 24 seats.
		{"10k ConfigMaps through a fleet", front.Cost{Kind: front.CostList, Walked: 10_000, Returned: 10_000, Bytes: 14 << 20, ShardSeatCPU: 300 * time.Microsecond}, 50, 10400 * time.Microsecond},
		{"wider than a core", front.Cost{Kind: front.CostList, Walked: 60_000, Returned: 60_000, Bytes: 1 << 20}, 50, 0},
		{"a GET", front.Cost{Kind: front.CostGet, Walked: 1, Returned: 1, Bytes: 5000}, 50, 0},
		{"a plain watch", front.Cost{Kind: front.CostWatch}, 50, 0},
		{"an empty LIST", front.Cost{Kind: front.CostList}, 50, 0},
	} {
		got := Linger(tc.c, Seats(tc.c), seatCPU, tc.seatsPerCore)
		if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("%s: lingers %v, want %v", tc.name, got, tc.want)
		}
		we := Estimate(tc.c, seatCPU, tc.seatsPerCore)
		if we.InitialSeats != Seats(tc.c) || we.AdditionalLatency != got {
			t.Errorf("%s: estimate %+v, want %d seats lingering %v", tc.name, we, Seats(tc.c), got)
		}
		if got > 0 && we.FinalSeats != we.InitialSeats {
			t.Errorf("%s: %d final seats, want its %d", tc.name, we.FinalSeats, we.InitialSeats)
		}
		if got == 0 && we.FinalSeats != 0 {
			t.Errorf("%s: %d final seats and no linger", tc.name, we.FinalSeats)
		}
		// The seat-seconds charged while it runs on a core and after
		// are the core's: seatsPerCore × its CPU time.
		if got > 0 {
			busy := cpuWork(tc.c) * float64(seatCPU+tc.c.ShardSeatCPU)
			charged := float64(we.InitialSeats)*busy + float64(we.FinalSeats)*float64(got)
			if want := tc.seatsPerCore * busy; charged < want*0.999 || charged > want*1.001 {
				t.Errorf("%s: %g seat-ns charged, want %g", tc.name, charged, want)
			}
		}
	}
}

// fixedCost is a Coster whose every request costs c.
type fixedCost struct{ c front.Cost }

func (f fixedCost) Cost(*http.Request, *request.RequestInfo) front.Cost { return f.c }

// TestEstimatorChargesByKind: a LIST lingers at the CPU per seat learned
// for LISTs, a watch-list at the one learned for watch-lists, and the
// learner counts each one's work as its kind's when it executes.
func TestEstimatorChargesByKind(t *testing.T) {
	perKind := map[seatcpu.Kind]time.Duration{seatcpu.List: 100 * time.Microsecond, seatcpu.WatchList: 400 * time.Microsecond}
	seatCPU := func(k seatcpu.Kind) time.Duration { return perKind[k] }
	full := front.Cost{Walked: 10_000, Returned: 10_000, Bytes: 14 << 20}
	for _, tc := range []struct {
		kind front.CostKind
		want seatcpu.Kind
	}{{front.CostList, seatcpu.List}, {front.CostWatchList, seatcpu.WatchList}} {
		c := full
		c.Kind = tc.kind
		r, classified := withClassified(httptest.NewRequest(http.MethodGet, "/api/v1/configmaps", nil))
		we := Estimator(fixedCost{c}, seatCPU, SeatsPerCore)(r, "global-default", "global-default")
		if want := Linger(c, we.InitialSeats, perKind[tc.want], SeatsPerCore); we.AdditionalLatency != want || want == 0 {
			t.Errorf("%s: lingers %v, want %v (at %v a seat)", tc.kind, we.AdditionalLatency, want, perKind[tc.want])
		}
		kind, work := noteExecuted(r)
		if kind != tc.want || work != cpuWork(c) || !classified.executed {
			t.Errorf("%s: counted %v seats' worth as %v, want %v as %v", tc.kind, work, kind, cpuWork(c), tc.want)
		}
	}
}

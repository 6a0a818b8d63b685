package apf

import (
	"testing"

	"github.com/cachetier/cachetier/cache-server/internal/front"
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

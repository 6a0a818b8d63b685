package apf

import (
	"testing"

	"k8s.io/utils/ptr"
)

func TestServerConcurrencyLimit(t *testing.T) {
	for _, tc := range []struct {
		name       string
		spec       *int32
		cpu        float64
		hasLimit   bool
		gomaxprocs int
		want       int
	}{
		{"the profile decides", ptr.To[int32](600), 0.5, true, 2, 600},
		{"a zero setting is unset", ptr.To[int32](0), 0, false, 4, 200},
		{"no limit: GOMAXPROCS", nil, 0, false, 2, 100},
		{"a limit below the cores", nil, 1.5, true, 8, 75},
		{"a limit above GOMAXPROCS", nil, 16, true, 4, 200},
		{"a fraction of a core: the minimum", nil, 0.2, true, 2, MinServerConcurrencyLimit},
	} {
		if got := ServerConcurrencyLimit(tc.spec, tc.cpu, tc.hasLimit, tc.gomaxprocs); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

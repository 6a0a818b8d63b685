package apf

import (
	"runtime"
	"testing"

	"k8s.io/utils/ptr"
)

func TestServerConcurrencyLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     *int32
		cpu      float64
		hasLimit bool
		cpus     int
		want     int
	}{
		{"the profile decides", ptr.To[int32](600), 0.5, true, 2, 600},
		{"a zero setting is unset", ptr.To[int32](0), 0, false, 4, 200},
		{"no limit: the CPUs", nil, 0, false, 2, 100},
		{"a limit below the cores", nil, 1.5, true, 8, 75},
		{"a limit above the CPUs", nil, 16, true, 4, 200},
		{"a fraction of a core: the minimum", nil, 0.2, true, 2, MinServerConcurrencyLimit},
	} {
		if got := ServerConcurrencyLimit(tc.spec, tc.cpu, tc.hasLimit, tc.cpus); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The tier runs more Ps than CPUs (package gomaxprocs); its seats must
// not grow with them.
func TestProcessConcurrencyLimitCountsCPUsNotSpareProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	runtime.GOMAXPROCS(runtime.NumCPU())
	limit, cores, err := ProcessConcurrencyLimit(nil)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GOMAXPROCS(2 * runtime.NumCPU())
	raisedLimit, raisedCores, err := ProcessConcurrencyLimit(nil)
	if err != nil {
		t.Fatal(err)
	}
	if raisedLimit != limit || raisedCores != cores {
		t.Fatalf("with 2 Ps per CPU: %d seats for %.2f cores, want %d for %.2f as with one", raisedLimit, raisedCores, limit, cores)
	}
}

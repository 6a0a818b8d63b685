package gomaxprocs

import (
	"runtime"
	"testing"
)

func TestFor(t *testing.T) {
	for cpus, want := range map[int]int{0: 2, 1: 2, 2: 4, 8: 16} {
		if got := For(cpus); got != want {
			t.Errorf("For(%d) = %d, want %d", cpus, got, want)
		}
	}
}

func TestRaise(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })

	unset := func(string) (string, bool) { return "", false }
	cpus, procs, raised := Raise(unset)
	if !raised || cpus != before || procs != For(before) || runtime.GOMAXPROCS(0) != procs {
		t.Fatalf("unset: cpus %d procs %d raised %v, GOMAXPROCS %d; want %d, %d, true", cpus, procs, raised, runtime.GOMAXPROCS(0), before, For(before))
	}

	runtime.GOMAXPROCS(before)
	set := func(name string) (string, bool) { return "3", name == "GOMAXPROCS" }
	if cpus, procs, raised := Raise(set); raised || cpus != before || procs != before || runtime.GOMAXPROCS(0) != before {
		t.Fatalf("set in the environment: cpus %d procs %d raised %v, GOMAXPROCS %d; want it left at %d", cpus, procs, raised, runtime.GOMAXPROCS(0), before)
	}
}

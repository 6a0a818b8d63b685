// Package gomaxprocs sets how many Go Ps the tier runs with: two per CPU
// it may use, not Go's one.
//
// The tier runs a large request's work on threads at a lower priority
// (package bulkthread) so that the kernel runs a kubelet's small LIST
// first. The kernel can only choose among threads that hold a P, though,
// and with one P per core two things undo the lowering under a flood:
//
//   - a lowered thread holds its P also while the kernel runs other
//     threads instead of it, so a small request's goroutine waits for a P
//     behind work that was meant to yield to it;
//   - with every P busy, nothing blocks in the network poller: a request's
//     bytes sit in the socket until the runtime's monitor thread polls,
//     every 10 ms (measured: 1–13 ms of a flooded node LIST's time,
//     docs/benchmarks.md, "Where the slowest node LISTs' time goes").
//
// With a spare P per core the short request gets a P at once and the
// kernel, which knows the threads' priorities, decides who runs.
// Measured on a fleet under issue 21's flood, four runs alternated
// (docs/benchmarks.md, "Two Go Ps per CPU"): the node's LIST p99 12–19 ms
// against 16–38 ms with one P per CPU, the flooder served as much. The
// priority-and-fairness seats still stand for the CPUs, not the Ps
// (apf.ProcessConcurrencyLimit).
package gomaxprocs

import "runtime"

// PerCPU is how many Ps the tier runs per CPU it may use.
const PerCPU = 2

// For is the Ps for a process whose default GOMAXPROCS — the CPUs it may
// run on, capped by its cgroup's CPU limit — is cpus.
func For(cpus int) int { return max(cpus, 1) * PerCPU }

// Raise sets GOMAXPROCS to For(the runtime's default) unless the
// environment sets GOMAXPROCS (lookupEnv is os.LookupEnv), and returns
// the CPUs and the Ps the process runs with (both the environment's
// value when it sets GOMAXPROCS: Go then runs that many). Setting it stops Go from
// following a later change of the CPU limit (an in-place pod resize), as
// the seats, sized once at start, do not follow it either.
func Raise(lookupEnv func(string) (string, bool)) (cpus, procs int, raised bool) {
	cpus = runtime.GOMAXPROCS(0)
	if _, set := lookupEnv("GOMAXPROCS"); set {
		return cpus, cpus, false
	}
	procs = For(cpus)
	runtime.GOMAXPROCS(procs)
	return cpus, procs, true
}

package apf

import (
	"math"
	"runtime"

	"github.com/cachetier/cachetier/cache-server/internal/cpulimit"
)

// The server's concurrency limit — the seats priority levels share — is
// what kube-apiserver sets with --max-requests-inflight plus
// --max-mutating-requests-inflight (600 by default). The tier sizes it
// from the CPU its pod may use: its requests are CPU work (walking
// stored objects, copying and gzipping bytes) with short waits (a
// consistent read's freshness wait, a slow client's writes), so seats
// track cores.
const (
	// SeatsPerCore: kube-apiserver's 600 seats are sized for a control
	// plane of about a dozen cores; per core that is 50. The tier's reads
	// are cheaper than the apiserver's (no decoding, no encoding of
	// stored objects), but waits (freshness, slow clients) hold seats
	// without using the CPU, so the same ratio leaves room for both.
	SeatsPerCore = 50
	// MinServerConcurrencyLimit keeps every default priority level at a
	// seat or more and leaves queuing room on a tier limited to a fraction
	// of a core.
	MinServerConcurrencyLimit = 20
)

// ServerConcurrencyLimit is the profile's setting when set, else
// SeatsPerCore per core of Cores, at least MinServerConcurrencyLimit.
func ServerConcurrencyLimit(spec *int32, cpuLimit float64, hasLimit bool, cpus int) int {
	if spec != nil && *spec > 0 {
		return int(*spec)
	}
	return max(MinServerConcurrencyLimit, int(math.Ceil(Cores(cpuLimit, hasLimit, cpus)*SeatsPerCore)))
}

// Cores is the CPU the server's seats stand for: the container's CPU
// limit (cpuLimit cores when hasLimit) or cpus, the CPUs the process can
// run on at once (ProcessConcurrencyLimit), whichever is lower.
func Cores(cpuLimit float64, hasLimit bool, cpus int) float64 {
	cores := float64(max(cpus, 1))
	if hasLimit && cpuLimit > 0 && cpuLimit < cores {
		cores = cpuLimit
	}
	return cores
}

// cgroupRoot is where a container's own cgroup is mounted.
const cgroupRoot = "/sys/fs/cgroup"

// ProcessConcurrencyLimit is ServerConcurrencyLimit for this process (its
// cgroup's CPU limit and GOMAXPROCS) and the cores it stands for. An
// unreadable limit counts as none (logged by the caller through err).
func ProcessConcurrencyLimit(spec *int32) (limit int, cores float64, err error) {
	cpu, ok, err := cpulimit.Read(cgroupRoot)
	hasLimit := ok && err == nil
	// The CPUs it can run on at once: GOMAXPROCS, but not the spare Ps
	// the tier runs beyond its CPUs (package gomaxprocs).
	cpus := min(runtime.GOMAXPROCS(0), runtime.NumCPU())
	return ServerConcurrencyLimit(spec, cpu, hasLimit, cpus), Cores(cpu, hasLimit, cpus), err
}

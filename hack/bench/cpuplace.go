package main

// -flood-server-cpus: the server under a flood on CPUs of its own, as on a
// cluster, where the flooder's client, the victims' clients and the
// control plane run on other machines and each pod has its own CPU. On
// this machine every process shares the same two cores, so without it a
// victim's latency under a flood is also the flooder's client's and the
// control plane's CPU (docs/benchmarks.md, "Floods": the scheduler traces).

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cachetier/cachetier/hack/proctree"
)

// cpuPlacement puts the server's processes on the server CPUs and every
// other process the bench started (the bench itself with the victims'
// clients, the flooder's client, the control plane and the tiers that are
// not under test) on the rest.
type cpuPlacement struct {
	server, rest, all unix.CPUSet
}

// newCPUPlacement parses -flood-server-cpus (a CPU list: "0", "0-1",
// "0,2"); nil for "". The server CPUs must be some, not all, of the CPUs
// the bench may run on.
func newCPUPlacement(list string) (*cpuPlacement, error) {
	if list == "" {
		return nil, nil
	}
	var p cpuPlacement
	if err := unix.SchedGetaffinity(0, &p.all); err != nil {
		return nil, fmt.Errorf("-flood-server-cpus: reading the bench's CPUs: %w", err)
	}
	server, err := parseCPUList(list)
	if err != nil {
		return nil, fmt.Errorf("-flood-server-cpus: %w", err)
	}
	for cpu := range 1024 {
		switch {
		case !server.IsSet(cpu):
			if p.all.IsSet(cpu) {
				p.rest.Set(cpu)
			}
		case !p.all.IsSet(cpu):
			return nil, fmt.Errorf("-flood-server-cpus: CPU %d is not one the bench may run on", cpu)
		default:
			p.server.Set(cpu)
		}
	}
	if p.rest.Count() == 0 {
		return nil, fmt.Errorf("-flood-server-cpus: %q leaves no CPU for the clients and the control plane", list)
	}
	return &p, nil
}

// parseCPUList parses the kernel's CPU list format ("0-2,5").
func parseCPUList(list string) (unix.CPUSet, error) {
	var set unix.CPUSet
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || first < 0 || last < first || last >= 1024 {
			return set, fmt.Errorf("%q is not a CPU list such as 0 or 0-1,3", list)
		}
		for cpu := first; cpu <= last; cpu++ {
			set.Set(cpu)
		}
	}
	return set, nil
}

// String is how the report names the placement.
func (p *cpuPlacement) String() string {
	return fmt.Sprintf("the server on CPUs %s; the bench, its clients and the rest of the control plane on CPUs %s", cpuList(&p.server), cpuList(&p.rest))
}

func cpuList(set *unix.CPUSet) string {
	var cpus []string
	for cpu := range 1024 {
		if set.IsSet(cpu) {
			cpus = append(cpus, strconv.Itoa(cpu))
		}
	}
	return strings.Join(cpus, ",")
}

// place pins every process the bench started to the rest, then the
// server's to the server CPUs. kube-apiserver and etcd notice (GOMAXPROCS
// follows a Go process's CPUs since Go 1.25), so on one CPU they run one P,
// as in a pod with that CPU. A tier process does not: it sets its Ps at
// start, two per CPU it had then (package gomaxprocs), and keeps them, as
// it keeps the seats it sized then.
func (p *cpuPlacement) place(serverPIDs []int) error {
	if err := pinBench(&p.rest); err != nil {
		return err
	}
	for _, pid := range serverPIDs {
		if err := pinProcess(pid, &p.server); err != nil {
			return err
		}
	}
	return nil
}

// release gives every process the bench started all its CPUs back.
func (p *cpuPlacement) release() error { return pinBench(&p.all) }

// pinBench sets the CPUs of the bench and of every process below it.
func pinBench(set *unix.CPUSet) error {
	for _, pid := range proctree.Read().Tree(os.Getpid()) {
		if err := pinProcess(pid, set); err != nil {
			return err
		}
	}
	return nil
}

// pinProcess sets the CPUs of every thread of pid (forEveryThread).
func pinProcess(pid int, set *unix.CPUSet) error {
	return forEveryThread(pid, func(tid int) error {
		if err := unix.SchedSetaffinity(tid, set); err != nil {
			return fmt.Errorf("setting the CPUs of thread %d of process %d: %w", tid, pid, err)
		}
		return nil
	})
}

package main

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for list, want := range map[string][]int{"0": {0}, "1-3": {1, 2, 3}, "0, 2-3,7": {0, 2, 3, 7}} {
		set, err := parseCPUList(list)
		if err != nil {
			t.Fatalf("%q: %v", list, err)
		}
		var got []int
		for cpu := range 1024 {
			if set.IsSet(cpu) {
				got = append(got, cpu)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q: got %v, want %v", list, got, want)
		}
	}
	for _, bad := range []string{"", "a", "-1", "3-1", "0-", "1024", "0,,1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestNewCPUPlacementRefusesAllOrForeignCPUs(t *testing.T) {
	if p, err := newCPUPlacement(""); p != nil || err != nil {
		t.Fatalf("empty: got %v, %v; want no placement", p, err)
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	if _, err := newCPUPlacement(cpuList(&mine)); err == nil || !strings.Contains(err.Error(), "no CPU for the clients") {
		t.Errorf("every CPU for the server: got %v", err)
	}
	if _, err := newCPUPlacement("1023"); err == nil || !strings.Contains(err.Error(), "not one the bench may run on") {
		t.Errorf("a CPU the bench may not use: got %v", err)
	}
}

// TestCPUPlacementPinsDescendants: a child of the bench goes to the rest,
// a server to its CPUs, and release gives both every CPU back.
func TestCPUPlacementPinsDescendants(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	first := -1
	for cpu := range 1024 {
		if mine.IsSet(cpu) {
			first = cpu
			break
		}
	}
	p, err := newCPUPlacement(strconv.Itoa(first))
	if err != nil {
		t.Fatal(err)
	}
	defer p.release()
	child := exec.Command("sleep", "30")
	server := exec.Command("sleep", "30")
	for _, c := range []*exec.Cmd{child, server} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	if err := p.place([]int{server.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	cpusOf := func(pid int) string {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			t.Fatal(err)
		}
		return cpuList(&set)
	}
	if got, want := cpusOf(server.Process.Pid), cpuList(&p.server); got != want {
		t.Errorf("server on CPUs %s, want %s", got, want)
	}
	for name, pid := range map[string]int{"the bench": os.Getpid(), "its child": child.Process.Pid} {
		if got, want := cpusOf(pid), cpuList(&p.rest); got != want {
			t.Errorf("%s on CPUs %s, want %s", name, got, want)
		}
	}
	if err := p.release(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{os.Getpid(), child.Process.Pid, server.Process.Pid} {
		if got, want := cpusOf(pid), cpuList(&mine); got != want {
			t.Errorf("process %d on CPUs %s after release, want %s", pid, got, want)
		}
	}
}

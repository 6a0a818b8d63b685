// Package proctree reads the machine's processes from /proc as a tree, for
// the test harness and the bench: a cluster's teardown finds what its
// components started (hack/cluster), the bench's CPU placement what the
// bench started (hack/bench -flood-server-cpus).
package proctree

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Process is one running process: its parent and command line (each
// argument followed by a space, so "/kubelet " matches the kubelet with or
// without arguments).
type Process struct {
	PPID    int
	Cmdline string
}

// Table is every running process by PID. Zombies are left out: they run
// nothing and are their parent's to reap.
type Table map[int]Process

// Read reads the Table from /proc. A process that ends while it is read
// is left out.
func Read() Table {
	out := Table{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f := statFields(filepath.Join("/proc", e.Name(), "stat"))
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		out[pid] = Process{PPID: ppid, Cmdline: strings.ReplaceAll(string(cmd), "\x00", " ")}
	}
	return out
}

// Alive says whether pid runs (exists and is not a zombie).
func Alive(pid int) bool {
	f := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	return len(f) > 0 && f[0] != "Z"
}

// statFields are the fields of a /proc stat file after the command name
// (state, ppid, …); nil when it cannot be read.
func statFields(path string) []string {
	stat, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	// The command name in parentheses may hold spaces and parentheses:
	// the fields start after its last closing parenthesis.
	end := strings.LastIndexByte(string(stat), ')')
	if end < 0 {
		return nil
	}
	return strings.Fields(string(stat[end+1:]))
}

// Tree is roots and every process below them, each once, children
// before their parents (the order to kill them in).
func (t Table) Tree(roots ...int) []int {
	children := map[int][]int{}
	for pid, p := range t {
		children[p.PPID] = append(children[p.PPID], pid)
	}
	var order []int
	seen := map[int]bool{}
	var visit func(int)
	visit = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		for _, ch := range children[pid] {
			visit(ch)
		}
		order = append(order, pid)
	}
	for _, r := range roots {
		visit(r)
	}
	return order
}

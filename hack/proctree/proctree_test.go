package proctree

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

// A child and its grandchild are in this process's tree, below it, and
// the tree is ordered for killing: children before parents.
func TestTreeOfThisProcess(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sh := cmd.Process.Pid
	var tree []int
	var table Table
	for range 100 { // until sh has started its sleep
		table = Read()
		if tree = table.Tree(os.Getpid()); len(tree) >= 3 {
			break
		}
	}
	at := func(pid int) int { return slices.Index(tree, pid) }
	if at(sh) < 0 || at(os.Getpid()) != len(tree)-1 {
		t.Fatalf("tree %v: want the shell %d and this process %d last", tree, sh, os.Getpid())
	}
	sleep := -1
	for pid, p := range table {
		if p.PPID == sh {
			sleep = pid
		}
	}
	if sleep < 0 || at(sleep) < 0 || at(sleep) > at(sh) {
		t.Fatalf("tree %v: want the shell's child %d before the shell %d", tree, sleep, sh)
	}
	if table[sh].Cmdline != "sh -c sleep 30 & wait " {
		t.Errorf("the shell's command line: %q", table[sh].Cmdline)
	}
	if !Alive(sh) {
		t.Error("the shell is not alive")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if Alive(sh) {
		t.Error("the shell is alive after it was killed and reaped")
	}
}

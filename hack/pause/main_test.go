package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSandboxPID1 runs the real binary as PID 1 of a new PID namespace, as
// runc starts it: orphans re-parented to it are reaped, and SIGTERM ends it
// with status 0.
func TestSandboxPID1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a new PID namespace needs root (CI runs as root)")
	}
	bin := filepath.Join(t.TempDir(), "pause")
	if b, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })

	// The shell exits at once; its `sleep` children become orphans of the
	// namespace's PID 1, exit, and must not stay zombies.
	orphans := exec.Command("nsenter", "-t", strconv.Itoa(cmd.Process.Pid), "-p", "--", "sh", "-c", "sleep 0.1 & sleep 0.1 & sleep 0.1 &")
	if b, err := orphans.CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, b)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		children, zombies := childrenOf(t, cmd.Process.Pid)
		if children == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s PID 1 still has %d children, %d of them zombies", children, zombies)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after SIGTERM: %v (stderr %q); want exit 0", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still running 10s after SIGTERM")
	}
}

// childrenOf counts the processes whose parent is pid, and the zombies
// among them, from /proc.
func childrenOf(t *testing.T, pid int) (children, zombies int) {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may contain spaces.
		rest := string(b[bytes.LastIndexByte(b, ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		children++
		if f[0] == "Z" {
			zombies++
		}
	}
	return children, zombies
}

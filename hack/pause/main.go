// Command pause is the sandbox ("pause") container of the test node's pods:
// it holds the pod's namespaces open, and as PID 1 of a pod that shares its
// process namespace it reaps the orphans re-parented to it. It does nothing
// else until SIGTERM or SIGINT, then exits 0 — what the kubelet expects
// when it stops a sandbox. The node cannot pull registry.k8s.io/pause, so
// hack/imagebuild packs this one.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is what -v prints; the image tag is dev-<content digest>
// (hack/imagebuild), so a changed binary is a new tag on its own.
const version = "1"

func main() {
	if len(os.Args) > 1 {
		if os.Args[1] == "-v" || os.Args[1] == "--version" {
			fmt.Println("cachetier pause", version)
			return
		}
		fmt.Fprintln(os.Stderr, "usage: pause [-v]")
		os.Exit(2)
	}
	if os.Getpid() != 1 {
		// Not fatal (handy when testing), but a sandbox always runs as PID 1.
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	// A PID 1 gets no default signal actions: without these handlers
	// SIGTERM would be ignored and the sandbox only die by SIGKILL.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
		os.Exit(0)
	}
}

// reap collects every exited child. Signals coalesce, so one SIGCHLD may
// stand for several children.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

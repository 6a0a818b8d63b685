package main

import (
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// niceOf is a thread's nice value (the raw getpriority call returns
// 20 - nice).
func niceOf(t *testing.T, tid int) int {
	t.Helper()
	p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		t.Fatal(err)
	}
	return 20 - p
}

// TestSetNiceEveryThread: setNice reaches every thread of the process, and
// a thread started afterwards inherits the value.
func TestSetNiceEveryThread(t *testing.T) {
	// Goroutines locked to threads of their own, so there are several.
	release := make(chan struct{})
	defer close(release)
	for range 3 {
		started := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			close(started)
			<-release
		}()
		<-started
	}
	orig := niceOf(t, unix.Gettid())
	want := min(orig+1, 19)
	if err := setNice(want); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := setNice(orig); err != nil {
			t.Logf("restoring nice %d: %v (needs root)", orig, err)
		}
	}()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if got := niceOf(t, tid); got != want {
			t.Errorf("thread %d: nice %d, want %d", tid, got, want)
		}
	}
	later := make(chan int)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		p, _ := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid()) // t.Fatal is for the test's goroutine
		later <- 20 - p
		<-release
	}()
	if got := <-later; got != want {
		t.Errorf("a thread started afterwards: nice %d, want %d", got, want)
	}
}

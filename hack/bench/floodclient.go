package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The flooder runs in a process of its own (-mode flood-client, started by
// runFloodPhase), as it would on a machine of its own. In the victims'
// process its 64 readers — each inflating and decrypting ~10 MiB bodies
// back to back — kept the Go scheduler of that process busy, so a victim's
// response waited behind them in the bench's run queue before its
// latency was taken: the bench measured its own client. In separate
// processes the kernel still shares the two cores among all of them, but
// a victim that wakes on its response is scheduled as a process of its
// own (CFS favours the task that slept), as a kubelet on its node is.
//
// Even so, the flooder's client was the largest CPU user of the flood: it
// inflated and decrypted every body the server sent it, and on a cluster
// it would do so on a machine of its own. Two things keep it out of the
// servers' way:
//
//   - With -flood-client-priority idle (the default) its threads run
//     under SCHED_IDLE. That is not "only when the cores are idle": a
//     scheduler trace of a fleet's LIST flood (perf sched, 8 s, 2 vCPUs,
//     kernel 6.18) had the flooder on a core for 3.5 of the 16 core-
//     seconds, 2.1 s of them while a server's or the victims' thread was
//     runnable and waiting — a waking thread is queued on the core it
//     woke on, behind another normal thread, while the other core runs
//     the idle-class flooder.
//   - So its LISTs are read as sent (readGzipped): the request is
//     client-go's, gzip accepted, and the server's work the same, but the
//     ~10 MiB bodies are not inflated. In the same trace after this, the
//     flooder ran 0.9 core-seconds, 0.5 s of them while another thread
//     waited, and the fleet served 55% more LISTs in the minute. Watch-
//     lists are still inflated and read up to their bookmark.
//
// The flood on the server is unchanged in kind — the client keeps its
// concurrent requests outstanding and reads each body as fast as the
// leftover CPU lets it. "normal" runs it as any process.

// floodClientSpec is what a flooder process is told (-flood-client-spec,
// JSON).
type floodClientSpec struct {
	Kubeconfig  string        `json:"kubeconfig"`
	Server      floodTarget   `json:"server"`
	URL         string        `json:"url"`
	Concurrency int           `json:"concurrency"`
	Read        floodRead     `json:"read"`
	Duration    time.Duration `json:"duration"`
	// Idle runs the process's threads under SCHED_IDLE.
	Idle bool `json:"idle"`
}

// floodTarget is where a client sends its requests (part of a
// floodServer).
type floodTarget struct {
	Host       string `json:"host"`
	CA         []byte `json:"ca,omitempty"`
	ServerName string `json:"serverName,omitempty"`
}

// floodCounts are a floodTally's counts; a flooder process reports its
// own on stdout (JSON).
type floodCounts struct {
	OK, TooMany, WithRetryAfter, S5x, Other, Dropped int
}

// runFloodClient is -mode flood-client: spec's flood for its duration,
// then the counts on stdout.
func runFloodClient(specJSON string) error {
	var spec floodClientSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("-flood-client-spec: %w", err)
	}
	// The bench's threads may run at a raised priority (-flood-victims-
	// nice), which this process inherited: the flooder does not keep it.
	set := func() error { return setNice(0) }
	if spec.Idle {
		set = schedIdle
	}
	if err := set(); err != nil {
		return err
	}
	// Four connections (HTTP/2 multiplexes the requests on them), as a
	// client-go program with a few clients would hold.
	var clients [4]*http.Client
	for i := range clients {
		c, err := floodClient(spec.Kubeconfig, spec.Server)
		if err != nil {
			return err
		}
		clients[i] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Duration)
	defer cancel()
	t := &floodTally{}
	var wg sync.WaitGroup
	for w := range spec.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				code, ra, lat, err := floodGet(ctx, clients[w%len(clients)], spec.URL, spec.Read)
				if cutByEnd(ctx, err) {
					return
				}
				t.add(code, ra, lat, err)
			}
		}()
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(t.floodCounts)
}

// floodClientProcess is a started flooder process.
type floodClientProcess struct {
	cmd    *exec.Cmd
	stdout *bytes.Buffer
}

// startFloodClient starts this binary in -mode flood-client with spec.
func startFloodClient(spec floodClientSpec) (*floodClientProcess, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p := &floodClientProcess{stdout: &bytes.Buffer{}}
	p.cmd = exec.Command(self, "-mode", "flood-client", "-flood-client-spec", string(b))
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the flooder process: %w", err)
	}
	return p, nil
}

// wait waits for the flooder's end and returns its tally. A flooder that
// outlives its duration by a minute is killed: a bench that hangs would
// measure nothing.
func (p *floodClientProcess) wait(duration time.Duration) (*floodTally, error) {
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(duration + time.Minute):
		_ = p.cmd.Process.Kill()
		err = fmt.Errorf("the flooder process did not end a minute after its %s", duration)
		<-done
	}
	if err != nil {
		return nil, fmt.Errorf("flooder process: %w", err)
	}
	var c floodCounts
	if err := json.Unmarshal(p.stdout.Bytes(), &c); err != nil {
		return nil, fmt.Errorf("flooder process: reading its counts %q: %w", p.stdout.String(), err)
	}
	return &floodTally{floodCounts: c}, nil
}

// schedIdle puts every thread of this process under SCHED_IDLE.
func schedIdle() error {
	return forEveryThread(os.Getpid(), func(tid int) error {
		if err := unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
			return fmt.Errorf("SCHED_IDLE for thread %d: %w", tid, err)
		}
		return nil
	})
}

// setNice gives every thread of this process the nice value n (a
// negative one needs CAP_SYS_NICE: root).
func setNice(n int) error {
	return forEveryThread(os.Getpid(), func(tid int) error {
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil {
			return fmt.Errorf("nice %d for thread %d: %w", n, tid, err)
		}
		return nil
	})
}

// forEveryThread calls set for every thread of process pid; threads
// started later inherit their scheduling (policy, nice, CPUs) from the
// thread that starts them. Scheduling is per thread on Linux, so each is
// set by its id, and the threads are listed again until a listing shows
// none that was not set (one could be started by a thread not yet set
// while the first listing is walked). A process or thread that ended
// meanwhile is no error.
func forEveryThread(pid int, set func(tid int) error) error {
	done := map[int]bool{}
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if os.IsNotExist(err) {
			return nil
		} else if err != nil {
			return err
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh, done[tid] = true, true
			if err := set(tid); err != nil && !errors.Is(err, unix.ESRCH) {
				return err
			}
		}
		if !fresh {
			return nil
		}
	}
}

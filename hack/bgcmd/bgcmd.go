// Package bgcmd runs a command in the background for tests, such as
// `kubectl get -w`: what it printed so far, readable while it runs, and
// whether (and how) it has ended.
package bgcmd

import (
	"bytes"
	"os/exec"
	"sync"
)

// Cmd is a started command.
type Cmd struct {
	*exec.Cmd
	// Stdout and Stderr collect the command's output.
	Stdout, Stderr Buffer
	exited         chan struct{}
	err            error
}

// Start starts name with args.
func Start(name string, args ...string) (*Cmd, error) {
	c := &Cmd{Cmd: exec.Command(name, args...), exited: make(chan struct{})}
	c.Cmd.Stdout, c.Cmd.Stderr = &c.Stdout, &c.Stderr
	if err := c.Cmd.Start(); err != nil {
		return nil, err
	}
	// The only Wait: Exited and Stop read its outcome.
	go func() {
		c.err = c.Cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// Exited is closed when the command has ended.
func (c *Cmd) Exited() <-chan struct{} { return c.exited }

// Running reports whether the command has not ended yet.
func (c *Cmd) Running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// Err is the command's result (Wait's error) once Exited is closed.
func (c *Cmd) Err() error {
	<-c.exited
	return c.err
}

// Stop kills the command (if it still runs) and waits for it.
func (c *Cmd) Stop() {
	_ = c.Process.Kill()
	<-c.exited
}

// Buffer is written by the command and read by the test meanwhile.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

package bgcmd

import (
	"strings"
	"testing"
	"time"
)

func TestOutputWhileRunningAndEnd(t *testing.T) {
	c, err := Start("sh", "-c", "echo one; echo err >&2; sleep 2; echo two")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(c.Stdout.String(), "one") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !c.Running() || c.Stdout.String() != "one\n" {
		t.Fatalf("while running: %v %q", c.Running(), c.Stdout.String())
	}
	if err := c.Err(); err != nil || c.Running() || c.Stdout.String() != "one\ntwo\n" || c.Stderr.String() != "err\n" {
		t.Fatalf("ended: %v %v %q %q", err, c.Running(), c.Stdout.String(), c.Stderr.String())
	}
	c.Stop() // after the end: no effect
}

func TestStop(t *testing.T) {
	c, err := Start("sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	c.Stop()
	if c.Running() || c.Err() == nil {
		t.Fatalf("killed: running %v, err %v", c.Running(), c.Err())
	}
}

package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestLoopbackIsBelowTheEphemeralRangeAndBindable(t *testing.T) {
	end := ephemeralStart()
	if end-lowest < 1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it, Loopback takes the kernel's pick", end)
	}
	seen := map[int]bool{}
	for range 50 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if port < lowest || port >= end {
			t.Fatalf("port %d outside [%d, %d): the kernel may give it to an outgoing connection", port, lowest, end)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("picked port %d cannot be bound: %v", port, err)
		}
		l.Close()
		seen[port] = true
	}
	if len(seen) < 40 {
		t.Fatalf("50 picks gave only %d distinct ports: pickers running side by side would collide", len(seen))
	}
}

func TestLoopbackSkipsAPortInUse(t *testing.T) {
	// A port someone listens on is never returned while they hold it.
	held := map[int]net.Listener{}
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 200 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if held[port] != nil {
			t.Fatalf("port %d returned while a listener holds it", port)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("picked port %d cannot be bound: %v", port, err)
		}
		held[port] = l
	}
}

func TestLoopbackAddr(t *testing.T) {
	addr, err := LoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("LoopbackAddr() = %q, want 127.0.0.1:<port>", addr)
	}
}

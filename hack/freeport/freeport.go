// Package freeport picks loopback TCP ports for the processes that tests
// and tools start (kube-apiserver, etcd, CoreDNS, cache-server), which
// must be told their port before they bind it.
//
// Why not listen on 127.0.0.1:0 and hand that port over: the kernel picks
// :0 from the ephemeral range, the same range it draws every outgoing
// connection's local port from. Between closing the probe and the
// child's bind, any client on the machine — a test running beside this
// one — may get that port for a connection, and the child dies with
// "bind: address already in use". The kernel never hands out ports below
// the ephemeral range on its own, so a port picked there can only collide
// with another picker's, and a random pick makes that rare.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the first port picked from: above the fixed ports a machine
// or a cluster's components commonly use (kubelet 10250, etcd 2379,
// node exporter 9100, Prometheus 9090).
const lowest = 20000

// attempts bounds the tries before giving up on the range: with
// thousands of ports in it, failing that many is a machine that is
// out of ports, not bad luck.
const attempts = 200

// Loopback returns a port on 127.0.0.1 that nothing listens on now and
// that the kernel will not give to an outgoing connection.
func Loopback() (int, error) {
	end := ephemeralStart()
	if end-lowest < 1000 {
		// An ephemeral range reaching down here leaves no room outside
		// it; take the kernel's pick and its small risk.
		return kernelPick()
	}
	var last error
	for range attempts {
		port := lowest + rand.IntN(end-lowest)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free loopback port in [%d, %d) after %d attempts: %w", lowest, end, attempts, last)
}

// LoopbackAddr is Loopback as a host:port address.
func LoopbackAddr() (string, error) {
	port, err := Loopback()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (Linux's default 32768 where the file cannot be read).
func ephemeralStart() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		return 32768
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= 0 || low > 65535 {
		return 32768
	}
	return low
}

func kernelPick() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

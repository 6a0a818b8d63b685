package controlplane

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestPortInUseFailsFastWithTheApiserversLog: when the apiserver cannot
// bind its port, Start returns at once with the apiserver's own log lines —
// not after its readiness timeout.
func TestPortInUseFailsFastWithTheApiserversLog(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	cp, err := Start(context.Background(), Options{SecurePort: l.Addr().(*net.TCPAddr).Port, ServiceClusterIPRange: "127.77.1.0/24"})
	if err == nil {
		cp.Stop()
		t.Fatal("started on a port in use")
	}
	if !strings.Contains(err.Error(), "kube-apiserver exited") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error does not carry the apiserver's log line about the port: %v", err)
	}
	if d := time.Since(start); d > 60*time.Second {
		t.Fatalf("took %s to report the port in use; the readiness wait is 90 s", d)
	}
}

// TestMissingBinaryNamesIt: a binary directory without the control plane
// is refused before anything starts, naming the binary and the fix.
func TestMissingBinaryNamesIt(t *testing.T) {
	_, err := Start(context.Background(), Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "etcd missing") || !strings.Contains(err.Error(), "make controlplane") {
		t.Fatalf("want an error naming etcd and `make controlplane`, got %v", err)
	}
}

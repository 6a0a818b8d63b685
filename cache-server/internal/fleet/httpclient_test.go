package fleet

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/internal/pki"
)

// TestHTTPClientFollowsCARotation: the client trusts exactly the bundle in
// the CA file, re-reads it when it changes (a CA rotation publishes old and
// new together), and sends the configured bearer token.
func TestHTTPClientFollowsCARotation(t *testing.T) {
	oldCA, err := pki.NewCA("old")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := pki.NewCA("new")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := newCA.IssueServing("shard", nil, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var gotAuth string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, oldCA.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := newHTTPClient(&rest.Config{BearerToken: "front-token"}, caFile, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := client.Get(srv.URL); err == nil {
		resp.Body.Close()
		t.Fatal("a shard certificate of a CA outside the bundle was accepted")
	}
	// Rotation: old and new CA together; a later modification time.
	if err := os.WriteFile(caFile, append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(caFile, later, later); err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatalf("after the bundle gained the new CA: %v", err)
	}
	resp.Body.Close()
	if gotAuth != "Bearer front-token" {
		t.Fatalf("Authorization %q, want the front's bearer token", gotAuth)
	}
	// A certificate of the trusted CA for another address is refused: the
	// front's token must only go to the shard it dialled.
	other, err := newCA.IssueServing("elsewhere", []string{"shard-9.example"}, []net.IP{net.ParseIP("10.0.0.9")})
	if err != nil {
		t.Fatal(err)
	}
	otherCert, err := tls.X509KeyPair(other.CertPEM, other.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	impostor := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the impostor got a request with Authorization %q", r.Header.Get("Authorization"))
	}))
	impostor.TLS = &tls.Config{Certificates: []tls.Certificate{otherCert}}
	impostor.StartTLS()
	defer impostor.Close()
	if resp, err := client.Get(impostor.URL); err == nil {
		resp.Body.Close()
		t.Fatal("a certificate for another host was accepted")
	}
	if _, err := NewHTTPClient(&rest.Config{}, filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

// TestShardDialerFindsDeadPeers: connections to shards probe an idle peer
// after 5 s, every 2 s, 3 times, and give up on unacknowledged data after
// 10 s — as the kernel reports the socket's options.
func TestShardDialerFindsDeadPeers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conn, err := shardDialer().Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int{
		"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
		"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
		"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
		"TCP_KEEPCNT":      {unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
		"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
	}
	values := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 10000}
	for name, opt := range want {
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), opt[0], opt[1]) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Fatalf("%s: %v", name, gerr)
		}
		if got != values[name] {
			t.Errorf("%s = %d, want %d", name, got, values[name])
		}
	}
}

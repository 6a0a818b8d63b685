package authedges

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPlaintextHTTP writes plaintext requests to the tier's TLS ports —
// the standalone tier's, the fleet front's and each shard's — and to
// kube-apiserver's, and compares the bytes that come back. Both are Go
// TLS servers: an HTTP/1 request line gets net/http's "400 Bad Request
// ... Client sent an HTTP request to an HTTPS server." and the connection
// is closed; an HTTP/2 cleartext preface is not a TLS record and the
// handshake fails. Neither reaches authentication, nor any handler.
func TestPlaintextHTTP(t *testing.T) {
	ports := map[string]string{
		"standalone":  hostPort(t, standaloneTier.DirectURL),
		"fleet front": hostPort(t, fleetTier.DirectURL),
	}
	for i, addr := range fleetTier.ShardAddrs {
		ports[fmt.Sprintf("fleet shard %d", i)] = addr
	}
	path := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	for _, c := range []struct{ name, request string }{
		{"HTTP/1.1 request", "GET " + path + " HTTP/1.1\r\nHost: tier\r\nAccept: application/json\r\n\r\n"},
		{"HTTP/2 cleartext preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := plaintext(t, hostPort(t, cp.URL), c.request)
			t.Logf("kube-apiserver: %q", want)
			if strings.HasPrefix(c.request, "GET") && !strings.HasPrefix(want, "HTTP/1.0 400 Bad Request") {
				t.Fatalf("kube-apiserver answered %q; want Go's 400", want)
			}
			for name, addr := range ports {
				got := plaintext(t, addr, c.request)
				t.Logf("%s: %q", name, got)
				if got != want {
					t.Errorf("%s answered %q; kube-apiserver %q", name, got, want)
				}
				if strings.Contains(got, "secret-ish") {
					t.Errorf("%s answered with data", name)
				}
			}
		})
	}
}

// plaintext writes request to addr over plain TCP and returns everything
// the server sends until it closes the connection.
func plaintext(t *testing.T, addr, request string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		// A server that closes with unread input resets the connection.
		return string(got) + "[connection reset]"
	case err != nil:
		t.Fatalf("%s: %v (after %q)", addr, err, got)
	}
	return string(got) + "[closed]"
}

func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

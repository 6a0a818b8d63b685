package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/rest"
)

// NewHTTPClient returns the client a front reaches its shards with: the
// credentials of cfg (a pod's ServiceAccount token, re-read as client-go
// does; or a client certificate) over TLS verified against the CA bundle in
// caFile. The bundle is re-read when the file changes: the operator rotates
// the fleet's CA by publishing old and new CA together before shards serve
// certificates of the new one, and a front that kept the old bundle would
// lose its shards until restarted.
//
// resolve, when not nil, gives the current address of a shard replica's
// name (ReplicaAddresses.Lookup); a name it does not know is looked up in
// DNS. Either way the shard's certificate is verified against the name.
func NewHTTPClient(cfg *rest.Config, caFile string, resolve func(host string) (string, bool)) (*http.Client, error) {
	return newHTTPClient(cfg, caFile, 10*time.Second, resolve)
}

func newHTTPClient(cfg *rest.Config, caFile string, recheck time.Duration, resolve func(string) (string, bool)) (*http.Client, error) {
	roots := &caFileRoots{path: caFile, every: recheck}
	if _, err := roots.pool(); err != nil {
		return nil, err
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(cfg.CertData) > 0 || cfg.CertFile != "" {
		certData, keyData := cfg.CertData, cfg.KeyData
		var err error
		if cfg.CertFile != "" {
			if certData, err = os.ReadFile(cfg.CertFile); err != nil {
				return nil, err
			}
			if keyData, err = os.ReadFile(cfg.KeyFile); err != nil {
				return nil, err
			}
		}
		pair, err := tls.X509KeyPair(certData, keyData)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	dialer := shardDialer()
	transport := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		// Our own TLS dial: the shard's certificate is verified against
		// the CA bundle as it is on disk now (tls.Config.RootCAs cannot
		// change) and against the host dialled, name or IP. The short
		// connect timeout lets a read fail over to another replica when a
		// shard pod is gone. HTTP/1.1 (no HTTP/2 with a custom dial): a
		// shard answer is one bulk stream, which HTTP/2's framing and flow
		// control only slow down (docs/benchmarks.md, "Fleet").
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			target := addr
			if resolve != nil {
				if ip, ok := resolve(host); ok {
					target = net.JoinHostPort(ip, port)
				}
			}
			raw, err := dialer.DialContext(ctx, network, target)
			if err != nil {
				return nil, err
			}
			c := tlsCfg.Clone()
			c.ServerName = host
			c.InsecureSkipVerify = true //nolint:gosec // verified in VerifyConnection, against host
			c.VerifyConnection = func(cs tls.ConnectionState) error { return roots.verify(cs, host) }
			conn := tls.Client(raw, c)
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := conn.HandshakeContext(hctx); err != nil {
				raw.Close()
				return nil, err
			}
			return conn, nil
		},
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: time.Minute,
	}
	// Bearer token (file), impersonation, user agent: client-go's own
	// wrappers, so a rotated ServiceAccount token is picked up as it is
	// for the apiserver.
	rt, err := rest.HTTPWrappersForConfig(cfg, transport)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: rt}, nil
}

// A shard replica whose node dies answers nothing more, not even a reset:
// its connections stay open on the front's side, and its change stream —
// which feeds the front's merged watermark, that every consistent read
// waits for — only stalls. With the kernel's defaults a silent peer is
// found after minutes (keepalive: 30 s idle and 9 probes; unacknowledged
// data: ~15 retransmissions). These bounds find it in about ten seconds,
// after which the stream is reopened on another replica and a request
// written to a dead pooled connection fails over to the next replica. A
// live shard's kernel answers the probes whatever its process is doing, so
// a busy replica is never mistaken for a dead one.
var deadPeerKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// shardDialer connects to a shard replica: a short connect timeout (a read
// fails over to another replica when a shard pod is gone) and the bounds
// above.
func shardDialer() *net.Dialer {
	return &net.Dialer{Timeout: 5 * time.Second, KeepAliveConfig: deadPeerKeepAlive, Control: setUserTimeout}
}

// deadPeerUserTimeout bounds how long sent data may stay unacknowledged
// (TCP_USER_TIMEOUT), which also ends the keepalive probing of an idle
// connection.
const deadPeerUserTimeout = 10 * time.Second

func setUserTimeout(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(deadPeerUserTimeout/time.Millisecond))
	}); err != nil {
		return err
	}
	return serr
}

// verify checks a shard's certificate chain against the bundle and host.
func (r *caFileRoots) verify(cs tls.ConnectionState, host string) error {
	pool, err := r.pool()
	if err != nil {
		return err
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("shard presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		DNSName: host, Roots: pool, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}

// caFileRoots is a CA bundle file, re-read at most every `every` when its
// modification time changed.
type caFileRoots struct {
	path  string
	every time.Duration

	mu      sync.Mutex
	checked time.Time
	modTime time.Time
	current *x509.CertPool
}

func (r *caFileRoots) pool() (*x509.CertPool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current != nil && time.Since(r.checked) < r.every {
		return r.current, nil
	}
	r.checked = time.Now()
	st, err := os.Stat(r.path)
	if err != nil {
		if r.current != nil {
			return r.current, nil // keep the last good bundle
		}
		return nil, err
	}
	if r.current != nil && st.ModTime().Equal(r.modTime) {
		return r.current, nil
	}
	data, err := os.ReadFile(r.path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		if r.current != nil {
			return r.current, nil
		}
		return nil, fmt.Errorf("%s holds no PEM certificate", r.path)
	}
	r.current, r.modTime = pool, st.ModTime()
	return pool, nil
}

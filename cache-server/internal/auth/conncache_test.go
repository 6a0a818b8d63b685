package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authentication/user"
	genericfilters "k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	clocktesting "k8s.io/utils/clock/testing"
)

// testRequestHeader is the front-proxy header configuration kubeadm
// clusters publish.
func testRequestHeader() *authenticatorfactory.RequestHeaderConfig {
	return &authenticatorfactory.RequestHeaderConfig{
		UsernameHeaders:     headerrequest.StaticStringSlice{"X-Remote-User"},
		UIDHeaders:          headerrequest.StaticStringSlice{"X-Remote-Uid"},
		GroupHeaders:        headerrequest.StaticStringSlice{"X-Remote-Group"},
		ExtraHeaderPrefixes: headerrequest.StaticStringSlice{"X-Remote-Extra-"},
	}
}

// fakeInner counts calls and behaves like the delegating union on the
// inputs it sees: X-Remote-User (request-header; clears its headers),
// "Bearer good-<name>" (bearertoken; removes Authorization), "Bearer error"
// (an error), anything else fails.
type fakeInner struct{ calls atomic.Int64 }

func (f *fakeInner) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	f.calls.Add(1)
	if name := req.Header.Get("X-Remote-User"); name != "" {
		rh := testRequestHeader()
		headerrequest.ClearAuthenticationHeaders(req.Header, rh.UsernameHeaders, rh.UIDHeaders, rh.GroupHeaders, rh.ExtraHeaderPrefixes)
		return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
	}
	switch a := req.Header.Get("Authorization"); {
	case strings.HasPrefix(a, "Bearer good-"):
		req.Header.Del("Authorization")
		return &authenticator.Response{User: &user.DefaultInfo{Name: strings.TrimPrefix(a, "Bearer good-")}}, true, nil
	case a == "Bearer error":
		return nil, false, errors.New("token review failed")
	}
	return nil, false, nil
}

var testStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func newTestAuthenticator(inner authenticator.Request) (*connCachingAuthenticator, *clocktesting.FakePassiveClock) {
	a := newConnCachingAuthenticator(inner, testRequestHeader(), 10*time.Second)
	clk := clocktesting.NewFakePassiveClock(testStart)
	a.clock = clk
	return a, clk
}

// testConn is one connection: its context (with or without a cache) and
// its peer certificates.
type testConn struct {
	ctx   context.Context
	state *tls.ConnectionState
}

func newTestConn(cached bool, leaf *x509.Certificate) testConn {
	ctx := context.Background()
	if cached {
		ctx = ConnContext(ctx, nil)
	}
	return testConn{ctx: ctx, state: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}}
}

func (c testConn) request(headers ...string) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil).WithContext(c.ctx)
	req.TLS = c.state
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return req
}

func (c testConn) cache() *connCache { return c.ctx.Value(connCacheCtxKey{}).(*connCache) }

// stubLeaf is a certificate as the authenticator sees it after the
// handshake; only NotAfter and Raw matter to the cache.
func stubLeaf(notAfter time.Time) *x509.Certificate {
	return &x509.Certificate{Raw: []byte(notAfter.String()), NotAfter: notAfter}
}

func mustAuthenticate(t *testing.T, a authenticator.Request, req *http.Request, want string) {
	t.Helper()
	resp, ok, err := a.AuthenticateRequest(req)
	if err != nil || !ok {
		t.Fatalf("authenticate: ok=%v err=%v", ok, err)
	}
	if got := resp.User.GetName(); got != want {
		t.Fatalf("user %q, want %q", got, want)
	}
}

func wantCalls(t *testing.T, inner *fakeInner, want int64) {
	t.Helper()
	if got := inner.calls.Load(); got != want {
		t.Fatalf("inner called %d times, want %d", got, want)
	}
}

func TestConnCacheReusesAnswerOnConnection(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	a.results = newResults()
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	for range 3 {
		mustAuthenticate(t, a, conn.request("X-Remote-User", "alice", "X-Remote-Group", "devs"), "alice")
	}
	wantCalls(t, inner, 1)

	// Another connection has its own cache.
	other := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	mustAuthenticate(t, a, other.request("X-Remote-User", "alice", "X-Remote-Group", "devs"), "alice")
	wantCalls(t, inner, 2)
	wantResults(t, a.results, map[string]float64{"hit": 2, "miss": 2, "bypass": 0})
}

// newResults is a fresh cachetier_authn_connection_cache_total.
func newResults() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_results_total"}, []string{"result"})
}

func wantResults(t *testing.T, results *prometheus.CounterVec, want map[string]float64) {
	t.Helper()
	for result, n := range want {
		if got := testutil.ToFloat64(results.WithLabelValues(result)); got != n {
			t.Errorf("%s answers counted %v, want %v", result, got, n)
		}
	}
}

func TestConnCacheSeparatesInputs(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	requests := []struct {
		headers []string
		user    string
	}{
		{[]string{"Authorization", "Bearer good-a"}, "a"},
		{[]string{"Authorization", "Bearer good-b"}, "b"},
		{[]string{"X-Remote-User", "alice"}, "alice"},
		{[]string{"X-Remote-User", "bob"}, "bob"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Uid", "1"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Group", "devs"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Group", "devs", "X-Remote-Group", "ops"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Group", "ops", "X-Remote-Group", "devs"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Extra-Scopes", "read"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Extra-Scopes", "write"}, "alice"},
		{[]string{"X-Remote-User", "alice", "X-Remote-Extra-Other", "read"}, "alice"},
	}
	for _, r := range requests {
		mustAuthenticate(t, a, conn.request(r.headers...), r.user)
	}
	wantCalls(t, inner, int64(len(requests)))
	for _, r := range requests {
		mustAuthenticate(t, a, conn.request(r.headers...), r.user)
	}
	wantCalls(t, inner, int64(len(requests)))

	// Headers the authenticators do not read share an entry.
	mustAuthenticate(t, a, conn.request("X-Remote-User", "bob", "Accept", "application/json"), "bob")
	wantCalls(t, inner, int64(len(requests)))
}

func TestConnCacheExtraPrefixCaseInsensitive(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	// A header map built by hand can hold non-canonical names; headerrequest
	// matches the extra prefix case-insensitively, so must the key.
	req := func(scope string) *http.Request {
		r := conn.request("X-Remote-User", "alice")
		r.Header["x-remote-extra-scopes"] = []string{scope}
		return r
	}
	mustAuthenticate(t, a, req("read"), "alice")
	mustAuthenticate(t, a, req("write"), "alice")
	wantCalls(t, inner, 2)
}

func TestConnCacheSkipsFailures(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	for range 2 {
		if _, ok, err := a.AuthenticateRequest(conn.request("Authorization", "Bearer bad")); ok || err != nil {
			t.Fatalf("bad token: ok=%v err=%v", ok, err)
		}
		if _, ok, err := a.AuthenticateRequest(conn.request("Authorization", "Bearer error")); ok || err == nil {
			t.Fatalf("erroring token: ok=%v err=%v", ok, err)
		}
	}
	wantCalls(t, inner, 4)
	if n := len(conn.cache().entries); n != 0 {
		t.Fatalf("%d entries cached for failures", n)
	}
}

func TestConnCacheTTL(t *testing.T) {
	inner := &fakeInner{}
	a, clk := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	req := func() *http.Request { return conn.request("X-Remote-User", "alice") }
	mustAuthenticate(t, a, req(), "alice")
	clk.SetTime(testStart.Add(10*time.Second - time.Nanosecond))
	mustAuthenticate(t, a, req(), "alice")
	wantCalls(t, inner, 1)
	clk.SetTime(testStart.Add(10 * time.Second))
	mustAuthenticate(t, a, req(), "alice")
	wantCalls(t, inner, 2)
}

func TestConnCacheCertificateNotAfter(t *testing.T) {
	inner := &fakeInner{}
	a, clk := newTestAuthenticator(inner)
	notAfter := testStart.Add(3 * time.Second) // before the 10s TTL
	conn := newTestConn(true, stubLeaf(notAfter))
	req := func() *http.Request { return conn.request("X-Remote-User", "alice") }
	mustAuthenticate(t, a, req(), "alice")
	clk.SetTime(notAfter.Add(-time.Nanosecond))
	mustAuthenticate(t, a, req(), "alice")
	wantCalls(t, inner, 1)
	clk.SetTime(notAfter)
	mustAuthenticate(t, a, req(), "alice")
	wantCalls(t, inner, 2)

	// An intermediate the peer sent bounds the entry too.
	inner2 := &fakeInner{}
	a2, clk2 := newTestAuthenticator(inner2)
	conn2 := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	conn2.state.PeerCertificates = append(conn2.state.PeerCertificates, stubLeaf(notAfter))
	mustAuthenticate(t, a2, conn2.request("X-Remote-User", "alice"), "alice")
	clk2.SetTime(notAfter)
	mustAuthenticate(t, a2, conn2.request("X-Remote-User", "alice"), "alice")
	wantCalls(t, inner2, 2)
}

func TestConnCacheBypass(t *testing.T) {
	leaf := stubLeaf(testStart.Add(time.Hour))
	cases := map[string]func() *http.Request{
		"no cache in context": func() *http.Request {
			return newTestConn(false, leaf).request("X-Remote-User", "alice")
		},
		"no client certificate": func() *http.Request {
			conn := newTestConn(true, leaf)
			conn.state = &tls.ConnectionState{}
			return conn.request("Authorization", "Bearer good-a")
		},
		"websocket protocol header": func() *http.Request {
			return newTestConn(true, leaf).request("X-Remote-User", "alice", "Sec-WebSocket-Protocol", "v5.channel.k8s.io")
		},
	}
	for name, newReq := range cases {
		t.Run(name, func(t *testing.T) {
			inner := &fakeInner{}
			a, _ := newTestAuthenticator(inner)
			a.results = newResults()
			req := newReq() // one connection for all requests
			for range 3 {
				r := req.Clone(req.Context())
				resp, ok, err := a.AuthenticateRequest(r)
				if !ok || err != nil || resp == nil {
					t.Fatalf("ok=%v err=%v", ok, err)
				}
			}
			wantCalls(t, inner, 3)
			wantResults(t, a.results, map[string]float64{"hit": 0, "miss": 0, "bypass": 3})
		})
	}
}

func TestConnCacheOtherLeafNotServed(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	mustAuthenticate(t, a, conn.request("X-Remote-User", "alice"), "alice")
	conn.state = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{stubLeaf(testStart.Add(2 * time.Hour))}}
	mustAuthenticate(t, a, conn.request("X-Remote-User", "alice"), "alice")
	mustAuthenticate(t, a, conn.request("X-Remote-User", "alice"), "alice")
	wantCalls(t, inner, 3)
}

func TestConnCacheStripsHeadersOnHit(t *testing.T) {
	inner := &fakeInner{}
	a, _ := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	headers := []string{
		"X-Remote-User", "alice", "X-Remote-Uid", "1", "X-Remote-Group", "devs",
		"X-Remote-Extra-Scopes", "read", "Authorization", "Bearer ignored", "Accept", "application/json",
	}
	var after []http.Header
	for range 2 {
		req := conn.request(headers...)
		mustAuthenticate(t, a, req, "alice")
		after = append(after, req.Header)
	}
	wantCalls(t, inner, 1)
	// The miss's request-header authenticator left Authorization (only
	// bearertoken removes it); the hit must leave the same.
	want := http.Header{"Authorization": {"Bearer ignored"}, "Accept": {"application/json"}}
	for i, h := range after {
		if fmt.Sprint(h) != fmt.Sprint(want) {
			t.Errorf("request %d headers after authentication: %v, want %v", i, h, want)
		}
	}

	// bearertoken's removal of Authorization is replayed as well.
	for range 2 {
		req := conn.request("Authorization", "Bearer good-a", "Accept", "application/json")
		mustAuthenticate(t, a, req, "a")
		if _, ok := req.Header["Authorization"]; ok {
			t.Errorf("Authorization left on request")
		}
	}
	wantCalls(t, inner, 2)
}

func TestConnCacheBound(t *testing.T) {
	inner := &fakeInner{}
	a, clk := newTestAuthenticator(inner)
	conn := newTestConn(true, stubLeaf(testStart.Add(time.Hour)))
	const users = 3 * connCacheMaxEntries
	for i := range users {
		// Distinct insertion times so "oldest" is well defined.
		clk.SetTime(testStart.Add(time.Duration(i) * time.Millisecond))
		mustAuthenticate(t, a, conn.request("X-Remote-User", fmt.Sprint("user", i)), fmt.Sprint("user", i))
		if n := len(conn.cache().entries); n > connCacheMaxEntries {
			t.Fatalf("%d entries after %d users, bound %d", n, i+1, connCacheMaxEntries)
		}
	}
	wantCalls(t, inner, users)
	// The newest users are the ones kept.
	mustAuthenticate(t, a, conn.request("X-Remote-User", fmt.Sprint("user", users-1)), fmt.Sprint("user", users-1))
	wantCalls(t, inner, users)
	mustAuthenticate(t, a, conn.request("X-Remote-User", "user0"), "user0")
	wantCalls(t, inner, users+1)
}

// HTTP/2 serves a connection's streams concurrently; run with -race.
func TestConnCacheConcurrent(t *testing.T) {
	inner := &fakeInner{}
	a := newConnCachingAuthenticator(inner, testRequestHeader(), time.Hour)
	conn := newTestConn(true, stubLeaf(time.Now().Add(2*time.Hour)))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprint("user", (g*200+i)%100)
				resp, ok, err := a.AuthenticateRequest(conn.request("X-Remote-User", name))
				if !ok || err != nil || resp.User.GetName() != name {
					t.Errorf("%s: ok=%v err=%v resp=%v", name, ok, err, resp)
					return
				}
			}
		})
	}
	wg.Wait()
}

// --- real TLS path ---

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) client(t testing.TB, cn string, orgs ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// countingCA counts VerifyOptions calls: the x509 authenticators fetch
// them right before each chain verification.
type countingCA struct {
	dynamiccertificates.CAContentProvider
	verifies atomic.Int64
}

func (c *countingCA) VerifyOptions() (x509.VerifyOptions, bool) {
	c.verifies.Add(1)
	return c.CAContentProvider.VerifyOptions()
}

func newCountingCA(t testing.TB, ca *testCA) *countingCA {
	t.Helper()
	p, err := dynamiccertificates.NewStaticCAContent(ca.cert.Subject.CommonName, ca.pem)
	if err != nil {
		t.Fatal(err)
	}
	return &countingCA{CAContentProvider: p}
}

// delegatingAuthenticator is Wrap's authenticator without TokenReview:
// front-proxy request-header and client-certificate authentication.
func delegatingAuthenticator(t testing.TB, clientCA, frontProxyCA *countingCA) (authenticator.Request, *authenticatorfactory.RequestHeaderConfig) {
	t.Helper()
	rh := testRequestHeader()
	rh.CAContentProvider = frontProxyCA
	rh.AllowedClientNames = headerrequest.StaticStringSlice{"front-proxy-client"}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		ClientCertificateCAContentProvider: clientCA,
		RequestHeaderConfig:                rh,
	}.New()
	if err != nil {
		t.Fatal(err)
	}
	return newConnCachingAuthenticator(authn, rh, 10*time.Second), rh
}

func TestConnCacheRealTLS(t *testing.T) {
	clientCA, frontProxyCA := newTestCA(t, "client-ca"), newTestCA(t, "front-proxy-ca")
	clientVerifies, frontProxyVerifies := newCountingCA(t, clientCA), newCountingCA(t, frontProxyCA)
	authn, rh := delegatingAuthenticator(t, clientVerifies, frontProxyVerifies)

	// The connection each request came on, by its client address: the
	// connections that carried requests, not every TLS connection the
	// server accepted (an HTTP/2 client may dial one it then closes
	// unused, when it finds its pooled connection usable after all).
	var connsMu sync.Mutex
	var reqConns []string
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		connsMu.Lock()
		reqConns = append(reqConns, r.RemoteAddr)
		connsMu.Unlock()
		u, _ := request.UserFrom(r.Context())
		fmt.Fprintf(w, "%s %v remote-user=%q", u.GetName(), u.GetGroups(), r.Header.Get("X-Remote-User"))
	})
	failed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "unauthorized", http.StatusUnauthorized) })
	srv := httptest.NewUnstartedServer(genericfilters.WithAuthentication(echo, authn, failed, nil, rh))
	srv.Config.ConnContext = ConnContext
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()

	client := func(cert tls.Certificate) *http.Client {
		// srv.Client() is one shared client: clone its transport so each
		// identity has its own connections.
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
		return &http.Client{Transport: tr}
	}
	get := func(c *http.Client, remoteUser string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/pods", nil)
		if remoteUser != "" {
			req.Header.Set("X-Remote-User", remoteUser)
			req.Header.Set("X-Remote-Group", "devs")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
			t.Fatalf("%s %d: %s", resp.Proto, resp.StatusCode, body)
		}
		return string(body)
	}
	wantVerifies := func(client, frontProxy int64) {
		t.Helper()
		if c, f := clientVerifies.verifies.Load(), frontProxyVerifies.verifies.Load(); c != client || f != frontProxy {
			t.Fatalf("chain verifications: client CA %d, front-proxy CA %d; want %d, %d", c, f, client, frontProxy)
		}
	}

	// A direct client: the union tries the front-proxy CA, then the client
	// CA, on the first request only.
	direct := client(clientCA.client(t, "alice", "devs"))
	for range 2 {
		if got, want := get(direct, ""), `alice [devs system:authenticated] remote-user=""`; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	wantVerifies(1, 1)
	// A new connection starts over.
	direct.CloseIdleConnections()
	get(direct, "")
	wantVerifies(2, 2)

	// The aggregator: one chain verification per user on the connection.
	proxy := client(frontProxyCA.client(t, "front-proxy-client"))
	for _, u := range []string{"bob", "bob", "carol", "bob"} {
		if got, want := get(proxy, u), u+` [devs system:authenticated] remote-user=""`; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	wantVerifies(2, 4)
	connsMu.Lock()
	defer connsMu.Unlock()
	// Requests 0–1 direct on one connection, 2 direct on a new one, 3–6
	// the proxy's on a third.
	if c := reqConns; len(c) != 7 || c[1] != c[0] || c[2] == c[0] ||
		c[4] != c[3] || c[5] != c[3] || c[6] != c[3] || c[3] == c[0] || c[3] == c[2] {
		t.Fatalf("the requests' connections %v, want 2 direct on one, 1 direct on another, 4 proxied on a third", c)
	}
}

func BenchmarkConnCache(b *testing.B) {
	clientCA := newTestCA(b, "client-ca")
	authn, _ := delegatingAuthenticator(b, newCountingCA(b, clientCA), newCountingCA(b, newTestCA(b, "front-proxy-ca")))
	cert := clientCA.client(b, "alice")
	state := &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert.Leaf}}
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cached=%v", cached), func(b *testing.B) {
			ctx := context.Background()
			if cached {
				ctx = ConnContext(ctx, nil)
			}
			req := httptest.NewRequest(http.MethodGet, "/api/v1/pods", nil).WithContext(ctx)
			req.TLS = state
			for b.Loop() {
				if _, ok, err := authn.AuthenticateRequest(req); !ok || err != nil {
					b.Fatalf("ok=%v err=%v", ok, err)
				}
			}
		})
	}
}

package authedges

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
)

// upstreamGate stands between a tier and the apiserver: a TLS reverse
// proxy that passes every request and answer through unchanged (the
// tier's own bearer token included, so the apiserver sees the tier's
// identity), except that, while held, it stops handing on the bodies of
// the watches a resource's freshness is proven by: the tier's main stream
// and its progress probes of that resource, which are cluster-wide
// watches of the collection. Everything else — the RV fetch (a watch of
// one key in a namespace of its own), TokenReviews, SubjectAccessReviews,
// LISTs — reaches the apiserver as before, so what the tier asks while it
// cannot prove freshness shows in the apiserver's audit log.
//
// It models a stalled network path, not a fake apiserver: the bytes that
// arrive while held are delivered, in order, when released.
type upstreamGate struct {
	srv *httptest.Server
	// heldPath is the collection whose watches are held (/api/v1/configmaps).
	heldPath string

	mu   sync.Mutex
	open chan struct{} // closed while not held
}

func newUpstreamGate(apiserver string, apiserverCA []byte, heldPath string) (*upstreamGate, error) {
	target, err := url.Parse(apiserver)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(apiserverCA)
	g := &upstreamGate{heldPath: heldPath, open: make(chan struct{})}
	close(g.open)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		// Watches are streams: hand on every write at once.
		FlushInterval: -1,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2: true,
		},
		ModifyResponse: func(resp *http.Response) error {
			if g.holds(resp.Request) {
				resp.Body = &heldBody{ReadCloser: resp.Body, gate: g, ctx: resp.Request.Context()}
			}
			return nil
		},
	}
	g.srv = httptest.NewUnstartedServer(proxy)
	g.srv.EnableHTTP2 = true
	g.srv.StartTLS()
	return g, nil
}

// URL is where the tier reaches the apiserver; CAPEM verifies it.
func (g *upstreamGate) URL() string { return g.srv.URL }

func (g *upstreamGate) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: g.srv.Certificate().Raw})
}

func (g *upstreamGate) Close() { g.srv.Close() }

// holds says whether r is a watch of the held collection.
func (g *upstreamGate) holds(r *http.Request) bool {
	watch, _ := strconv.ParseBool(r.URL.Query().Get("watch"))
	return r.Method == http.MethodGet && r.URL.Path == g.heldPath && watch
}

// Hold stops handing on the held watches' bytes from now on.
func (g *upstreamGate) Hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// Release hands on what was held and everything after it.
func (g *upstreamGate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *upstreamGate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heldBody reads from the apiserver first and waits for the gate after:
// bytes that arrive while held (a read already blocked when Hold was
// called included) are handed on only once released.
type heldBody struct {
	io.ReadCloser
	gate *upstreamGate
	ctx  context.Context
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if werr := b.gate.wait(b.ctx); werr != nil {
		return 0, werr
	}
	return n, err
}

package auth

// Per-connection authentication cache.
//
// Why: k8s.io/apiserver's x509 and request-header authenticators verify the
// client certificate chain (crypto/x509.(*Certificate).Verify, an ECDSA
// P-256 signature check per link) on every request, although the peer
// certificates of a TLS connection cannot change after the handshake. A CPU
// profile of paginated LISTs (limit=500, 20 pages back to back on one HTTP/2
// connection) put ~7% of the tier's CPU there. kube-apiserver itself
// verifies per request and has no such cache; the tier serves many small
// requests per connection, so it remembers successful answers per
// connection for a few seconds instead.
//
// Safety: a cached answer is reused only for a request on the same
// connection (same peer certificates) whose other authentication inputs —
// the Authorization header and the configured request-header headers — hash
// to the same key; only successes are cached, for at most the TokenReview /
// SubjectAccessReview cache TTL and never past the NotAfter of any
// certificate the peer presented. Requests the websocket token
// authenticator could look at (Sec-WebSocket-Protocol) and connections
// without client certificates (nothing to save: no chain to verify; bearer
// tokens already have the TokenReview cache) always go to the inner
// authenticator.

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/utils/clock"
)

// connCacheMaxEntries bounds each connection's cache: a connection from the
// aggregator carries the requests of many users (X-Remote-User).
const connCacheMaxEntries = 64

type connCacheCtxKey struct{}

// ConnContext is meant for http.Server.ConnContext: it gives every accepted
// connection its own authentication cache, shared by the connection's
// requests (which HTTP/2 serves concurrently). Without it, Wrap
// authenticates every request in full.
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connCacheCtxKey{}, &connCache{})
}

type connCacheKey [sha256.Size]byte

// connCache is one connection's cache.
type connCache struct {
	mu sync.Mutex
	// leaf is the peer's leaf certificate when the first answer was stored.
	// Go's TLS server neither renegotiates nor does post-handshake auth, so
	// it cannot change; the check only makes the assumption explicit.
	leaf    *x509.Certificate
	entries map[connCacheKey]connCacheEntry
}

type connCacheEntry struct {
	resp    *authenticator.Response
	expires time.Time
	// What the inner authenticators removed from the request on the miss,
	// replayed on a hit so the request leaves identical either way.
	clearedAuthorization, clearedRequestHeaders bool
}

func (c *connCache) get(leaf *x509.Certificate, key connCacheKey, now time.Time) (connCacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !sameCert(c.leaf, leaf) {
		return connCacheEntry{}, false
	}
	e, ok := c.entries[key]
	if !ok {
		return connCacheEntry{}, false
	}
	if !now.Before(e.expires) {
		delete(c.entries, key)
		return connCacheEntry{}, false
	}
	return e, true
}

func (c *connCache) put(leaf *x509.Certificate, key connCacheKey, e connCacheEntry, now time.Time, maxEntries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaf == nil {
		c.leaf = leaf
	} else if !sameCert(c.leaf, leaf) {
		return
	}
	if c.entries == nil {
		c.entries = make(map[connCacheKey]connCacheEntry)
	}
	if _, exists := c.entries[key]; !exists && len(c.entries) >= maxEntries {
		// Drop what has expired; if that frees nothing, the entry closest
		// to expiry (with one TTL for all, the oldest). 64 entries: a
		// linear scan is cheaper than keeping an order.
		var oldest connCacheKey
		var oldestExpires time.Time
		for k, v := range c.entries {
			if !now.Before(v.expires) {
				delete(c.entries, k)
			} else if oldestExpires.IsZero() || v.expires.Before(oldestExpires) {
				oldest, oldestExpires = k, v.expires
			}
		}
		if len(c.entries) >= maxEntries {
			delete(c.entries, oldest)
		}
	}
	c.entries[key] = e
}

func sameCert(a, b *x509.Certificate) bool {
	return a == b || (a != nil && b != nil && a.Equal(b))
}

// connCachingAuthenticator answers from the connection's cache when it can
// and asks inner otherwise.
type connCachingAuthenticator struct {
	inner authenticator.Request
	// requestHeader is the front-proxy configuration inner uses; nil when
	// there is none.
	requestHeader *authenticatorfactory.RequestHeaderConfig
	ttl           time.Duration
	maxEntries    int
	clock         clock.PassiveClock
	// results counts answers by result (hit, miss, bypass); may be nil.
	results *prometheus.CounterVec
}

func (a *connCachingAuthenticator) count(result string) {
	if a.results != nil {
		a.results.WithLabelValues(result).Inc()
	}
}

func newConnCachingAuthenticator(inner authenticator.Request, rh *authenticatorfactory.RequestHeaderConfig, ttl time.Duration) *connCachingAuthenticator {
	return &connCachingAuthenticator{inner: inner, requestHeader: rh, ttl: ttl, maxEntries: connCacheMaxEntries, clock: clock.RealClock{}}
}

// The websocket authenticator reads a bearer token from this header.
const webSocketProtocolHeader = "Sec-Websocket-Protocol"

func (a *connCachingAuthenticator) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	cache, _ := req.Context().Value(connCacheCtxKey{}).(*connCache)
	if cache == nil || req.TLS == nil || len(req.TLS.PeerCertificates) == 0 || len(req.Header[webSocketProtocolHeader]) > 0 {
		a.count("bypass")
		return a.inner.AuthenticateRequest(req)
	}
	leaf := req.TLS.PeerCertificates[0]
	key := a.key(req.Header)
	now := a.clock.Now()
	if e, ok := cache.get(leaf, key, now); ok {
		if e.clearedAuthorization {
			req.Header.Del("Authorization")
		}
		if e.clearedRequestHeaders {
			rh := a.requestHeader
			headerrequest.ClearAuthenticationHeaders(req.Header, rh.UsernameHeaders, rh.UIDHeaders, rh.GroupHeaders, rh.ExtraHeaderPrefixes)
		}
		a.count("hit")
		return e.resp, true, nil
	}
	a.count("miss")

	hadAuthorization := len(req.Header["Authorization"]) > 0
	hadUser := a.hasUsername(req.Header)
	resp, ok, err := a.inner.AuthenticateRequest(req)
	if !ok || err != nil || resp == nil {
		return resp, ok, err
	}
	// Expiry counts from before the inner call and stops at the first
	// NotAfter among the presented certificates (x509 verification would
	// fail from then on).
	expires := now.Add(a.ttl)
	for _, c := range req.TLS.PeerCertificates {
		if c.NotAfter.Before(expires) {
			expires = c.NotAfter
		}
	}
	cache.put(leaf, key, connCacheEntry{
		// The response is shared by the connection's later requests, as the
		// token cache shares its answers: nothing downstream mutates it.
		resp:    resp,
		expires: expires,
		// bearertoken removes Authorization on success; the request-header
		// authenticator removes its headers on success, which needs a
		// username header.
		clearedAuthorization:  hadAuthorization && len(req.Header["Authorization"]) == 0,
		clearedRequestHeaders: hadUser && !a.hasUsername(req.Header),
	}, now, a.maxEntries)
	return resp, ok, err
}

func (a *connCachingAuthenticator) hasUsername(h http.Header) bool {
	if a.requestHeader == nil {
		return false
	}
	for _, name := range a.requestHeader.UsernameHeaders.Value() {
		if len(h.Values(name)) > 0 {
			return true
		}
	}
	return false
}

// key hashes every request input of inner other than the peer certificates,
// looked up the way inner looks them up: bearertoken reads Authorization,
// headerrequest reads the username, UID and group headers by canonical name
// and every header whose name starts with an extra prefix, compared
// case-insensitively. All values of each header are included (inner reads
// the first of a username/UID header): extra inputs only split entries.
// Each field is length-prefixed so distinct inputs cannot encode alike.
func (a *connCachingAuthenticator) key(h http.Header) connCacheKey {
	b := make([]byte, 0, 256)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	values := func(vv []string) {
		b = binary.AppendUvarint(b, uint64(len(vv)))
		for _, v := range vv {
			str(v)
		}
	}
	values(h["Authorization"])
	if rh := a.requestHeader; rh != nil {
		for _, names := range [][]string{rh.UsernameHeaders.Value(), rh.UIDHeaders.Value(), rh.GroupHeaders.Value()} {
			b = binary.AppendUvarint(b, uint64(len(names)))
			for _, name := range names {
				values(h[http.CanonicalHeaderKey(name)])
			}
		}
		var extra []string
		for name := range h {
			for _, prefix := range rh.ExtraHeaderPrefixes.Value() {
				if len(name) >= len(prefix) && strings.EqualFold(name[:len(prefix)], prefix) {
					extra = append(extra, name)
					break
				}
			}
		}
		sort.Strings(extra) // map order is random
		b = binary.AppendUvarint(b, uint64(len(extra)))
		for _, name := range extra {
			str(name)
			values(h[name])
		}
	}
	return sha256.Sum256(b)
}

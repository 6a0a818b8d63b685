package openapi

import (
	"context"
	"crypto/sha512"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Media types the apiserver serves its OpenAPI documents in (kube-openapi's
// handler and handler3). Requests use the @-spelling clients send, answers
// carry the dotted one.
const (
	mediaJSON          = "application/json"
	mediaV2Proto       = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
	mediaV2ProtoAccept = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
	mediaV3Proto       = "application/com.github.proto-openapi.spec.v3.v1.0+protobuf"
	mediaV3ProtoAccept = "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
)

// maxDocumentBytes bounds one upstream answer: the v2 document of a
// cluster with many CRDs is tens of MiB; an answer past this is refused
// rather than allowed to grow the tier's memory without bound.
const maxDocumentBytes = 256 << 20

// upstream reads documents from the apiserver with the tier's own
// credentials (the apiserver serves /openapi/* to every authenticated user).
type upstream struct {
	client *http.Client
	base   string // scheme://host[/path], no trailing slash
}

func newUpstream(cfg *rest.Config) (*upstream, error) {
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	return &upstream{client: client, base: strings.TrimRight(host, "/")}, nil
}

// answer is one upstream response.
type answer struct {
	status       int
	body         []byte
	etag         string // unquoted
	contentType  string
	lastModified time.Time
}

// get fetches pathAndQuery (e.g. /openapi/v3/api/v1?hash=...) in the media
// type accept, conditionally on etag when it is set.
func (u *upstream) get(ctx context.Context, pathAndQuery, accept, etag string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.base+pathAndQuery, nil)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Accept", accept)
	if etag != "" {
		req.Header.Set("If-None-Match", strconv.Quote(etag))
	}
	resp, err := u.client.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("GET %s: %w", pathAndQuery, err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type")}
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		a.lastModified = t
	}
	if tag := resp.Header.Get("Etag"); tag != "" {
		if a.etag, err = strconv.Unquote(tag); err != nil {
			a.etag = tag
		}
	}
	switch resp.StatusCode {
	case http.StatusNotModified:
		return a, nil
	case http.StatusOK:
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return a, fmt.Errorf("GET %s: %s: %s", pathAndQuery, resp.Status, strings.TrimSpace(string(msg)))
	}
	a.body, err = io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return a, fmt.Errorf("GET %s: reading the body: %w", pathAndQuery, err)
	}
	if len(a.body) > maxDocumentBytes {
		return a, fmt.Errorf("GET %s: the document is larger than %d bytes", pathAndQuery, maxDocumentBytes)
	}
	return a, nil
}

// getDocument is get for a document (not the v3 discovery, which the
// apiserver sends as text/plain): its media type must be the one asked
// for.
func (u *upstream) getDocument(ctx context.Context, pathAndQuery, accept, etag string) (answer, error) {
	a, err := u.get(ctx, pathAndQuery, accept, etag)
	if err != nil || a.status != http.StatusOK {
		return a, err
	}
	if ct := a.contentType; ct != accept && !(accept == mediaV2ProtoAccept && ct == mediaV2Proto) && !(accept == mediaV3ProtoAccept && ct == mediaV3Proto) {
		return a, fmt.Errorf("GET %s: asked for %s, got %q", pathAndQuery, accept, ct)
	}
	return a, nil
}

// hashOf is the apiserver's ETag of a JSON document (kube-openapi's
// computeETag): the v3 discovery's ?hash= and the ETag of both encodings.
func hashOf(json []byte) string {
	return fmt.Sprintf("%X", sha512.Sum512(json))
}

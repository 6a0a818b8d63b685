package openapi

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/NYTimes/gziphandler"
	"github.com/munnerz/goautoneg"
	"k8s.io/apiserver/pkg/endpoints/request"
)

// aggregatorUser is the identity kube-aggregator's OpenAPI controllers
// fetch an APIService's /openapi/v2 and /openapi/v3 with (kube-aggregator
// pkg/controllers/openapi{,v3}/aggregator); it reaches the tier through
// the front proxy as X-Remote-User.
const aggregatorUser = "system:aggregator"

// ServeOpenAPI answers p, a path under /openapi/. prefix is the aggregated
// path prefix the request came under ("" when it came to the root).
//
// The tier has two faces. Below the prefix, and at the root for everyone
// but the aggregator, it is the cached resources' apiserver: the
// upstream's documents. At the root, to the aggregator, it is the backend
// of the profile's own API group: documents describing only that group
// (groupDocuments explains why anything more would damage the cluster's
// merged spec). The group's v3 document is also answered at the root for
// everyone, because the aggregator proxies clients' requests for it there.
func (k *Keeper) ServeOpenAPI(w http.ResponseWriter, r *http.Request, p, prefix string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "the OpenAPI documents are read-only", http.StatusMethodNotAllowed)
		return
	}
	s := k.snap.Load()
	if s == nil {
		// The apiserver's answer while it has no document yet.
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	aggregator := prefix == "" && isAggregator(r)
	switch {
	case p == "/openapi/v2":
		doc := s.v2
		if aggregator {
			doc = s.groupV2
		}
		gziphandler.GzipHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serveV2(w, r, doc) })).ServeHTTP(w, r)
	case p == "/openapi/v3":
		body := s.v3Discovery
		if aggregator {
			body = s.groupV3Discovery
		}
		serveDiscovery(w, r, body)
	case strings.HasPrefix(p, "/openapi/v3/"):
		gv := strings.TrimPrefix(p, "/openapi/v3/")
		if prefix == "" && gv == s.groupPath {
			serveV3(w, r, gv, prefix, s.groupV3)
			return
		}
		if doc, ok := s.v3[gv]; ok {
			serveV3(w, r, gv, prefix, doc)
			return
		}
		notFound(w)
	default:
		notFound(w)
	}
}

func isAggregator(r *http.Request) bool {
	u, ok := request.UserFrom(r.Context())
	return ok && u.GetName() == aggregatorUser
}

// notFound is the apiserver's answer for a group-version it has no
// document for: 404 without a body.
func notFound(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusNotFound)
}

// encoding is one media type a document is served in.
type encoding struct {
	typ, subtype, contentType string
	proto                     bool
}

var (
	v2Encodings = []encoding{
		{"application", "json", mediaJSON, false},
		{"application", "com.github.proto-openapi.spec.v2@v1.0+protobuf", mediaV2Proto, true},
		{"application", "com.github.proto-openapi.spec.v2.v1.0+protobuf", mediaV2Proto, true},
	}
	v3Encodings = []encoding{
		{"application", "json", mediaJSON, false},
		{"application", "com.github.proto-openapi.spec.v3.v1.0+protobuf", mediaV3Proto, true},
		{"application", "com.github.proto-openapi.spec.v3@v1.0+protobuf", mediaV3Proto, true},
	}
)

// negotiate picks the first encoding the Accept header's clauses (highest
// q first) allow, as kube-openapi's handlers do; ok is false for 406.
func negotiate(r *http.Request, offered []encoding) (encoding, bool) {
	accept := r.Header.Get("Accept")
	if accept == "" {
		accept = "*/*"
	}
	for _, c := range goautoneg.ParseAccept(accept) {
		for _, e := range offered {
			if (c.Type == e.typ || c.Type == "*") && (c.SubType == e.subtype || c.SubType == "*") {
				return e, true
			}
		}
	}
	return encoding{}, false
}

func (d document) body(e encoding) []byte {
	if e.proto {
		return d.proto
	}
	return d.json
}

// serveV2 answers /openapi/v2 as the apiserver does: negotiated encoding,
// the document's ETag (conditional requests answered 304), Last-Modified.
func serveV2(w http.ResponseWriter, r *http.Request, d document) {
	w.Header().Add("Vary", "Accept")
	e, ok := negotiate(r, v2Encodings)
	if !ok {
		w.WriteHeader(http.StatusNotAcceptable)
		return
	}
	w.Header().Set("Content-Type", e.contentType)
	w.Header().Set("Etag", strconv.Quote(d.etag))
	w.Header().Set("Cache-Control", "no-cache, private")
	http.ServeContent(w, r, "/openapi/v2", d.modified, bytes.NewReader(d.body(e)))
}

// serveDiscovery answers /openapi/v3 as the apiserver's aggregator does
// (no ETag, Last-Modified now, the content type ServeContent sniffs).
func serveDiscovery(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Cache-Control", "no-cache, private")
	http.ServeContent(w, r, "/openapi/v3", time.Now(), bytes.NewReader(body))
}

// serveV3 answers /openapi/v3/<gv> as the apiserver does: a URL with the
// current ?hash= is immutable and cacheable for a year; an outdated hash
// is redirected (301) to the current one, below the same prefix.
func serveV3(w http.ResponseWriter, r *http.Request, gv, prefix string, d document) {
	w.Header().Add("Vary", "Accept")
	e, ok := negotiate(r, v3Encodings)
	if !ok {
		w.WriteHeader(http.StatusNotAcceptable)
		return
	}
	w.Header().Set("Content-Type", e.contentType)
	w.Header().Set("Etag", strconv.Quote(d.etag))
	if hash := r.URL.Query().Get("hash"); hash != "" {
		if hash != d.etag {
			w.Header().Set("Cache-Control", "no-cache, private")
			http.Redirect(w, r, prefix+relativeURL(gv, d.etag), http.StatusMovedPermanently)
			return
		}
		w.Header().Set("Cache-Control", "public, immutable")
		w.Header().Set("Expires", time.Now().AddDate(1, 0, 0).Format(time.RFC1123))
	} else {
		w.Header().Set("Cache-Control", "no-cache, private")
	}
	http.ServeContent(w, r, "", d.modified, bytes.NewReader(d.body(e)))
}

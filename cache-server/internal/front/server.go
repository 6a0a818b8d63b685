// Package front is the tier's read API: discovery, GET and LIST of cached
// resources with the apiserver's parameter semantics (resourceVersion,
// resourceVersionMatch, limit/continue, selectors), consistent reads by
// freshness waits, and 405 for writes. It sees each resource through its
// ingester and store, so the same logic serves shards in this process
// (standalone) or, later, behind a remote shard client.
package front

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	encoding_ "github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
	"github.com/cachetier/cachetier/internal/aggpath"
)

// Resource is one cached resource as the front serves it.
type Resource struct {
	Entry  catalog.Entry
	Source Source
	// Hub fans the resource's changes out to watchers.
	Hub *watch.Hub
	// Printer builds the resource's Tables (kubectl get); nil: the
	// apiserver's default Name/Created At table.
	Printer tables.Printer
}

// Options configure a Server.
type Options struct {
	Resources []Resource
	// ProtobufCacheBytes bounds the cache of protobuf encodings of stored
	// objects (0: encoding.DefaultCacheBytes).
	ProtobufCacheBytes int64
	// ListGzipCacheBytes bounds the compressed LIST chunks kept for later
	// LISTs of the same objects (package gzipchunks; 0: its default,
	// negative: none kept, every gzipped LIST compressed whole).
	ListGzipCacheBytes int64
	// FreshnessTimeout bounds a consistent read's wait for the cache
	// (504 after it, as the apiserver's watch cache does after 3s).
	FreshnessTimeout time.Duration
	// Paths are the profile's aggregated paths (package aggpath): requests
	// below Paths.Prefix or Paths.Root are served as if the prefix were
	// absent, so a kubeconfig whose server URL ends in one works unchanged.
	// Zero: the front is served at its root only.
	Paths aggpath.Paths
	// Version is what /version reports: the upstream apiserver's.
	Version *version.Info
	// OpenAPI serves /openapi/v2, /openapi/v3 and /openapi/v3/<gv>
	// (package openapi); nil answers 404.
	OpenAPI OpenAPI
	Metrics *metrics.Metrics
	Log     logr.Logger
}

// OpenAPI serves the OpenAPI documents below /openapi/. prefix is the
// aggregated path prefix the request came under, "" at the root.
type OpenAPI interface {
	ServeOpenAPI(w http.ResponseWriter, r *http.Request, path, prefix string)
	// Ready is nil once the documents are loaded: the aggregator fetches
	// them as soon as the APIService is registered, and backs off for a
	// minute or more after a failure.
	Ready() error
}

// Server is the read API handler.
type Server struct {
	opts      Options
	resources map[schema.GroupVersionResource]*resource
	discovery *discovery
	infos     *request.RequestInfoFactory
}

type resource struct {
	Resource
	// protobuf converts stored JSON to protobuf, caching per stored object
	// within a byte budget shared by all resources of the server (see
	// package encoding for how memory stays bounded).
	protobuf *encoding_.Protobuf
	// bodies pools response writers (compression, streaming buffers);
	// shared by all resources of the server.
	bodies *bodyWriters
	// gzipChunks keeps the compressed chunks of the resource's gzipped
	// JSON LISTs (nil: not kept). A LocalSource's objects are known by
	// their Seqs, states of objects of one Store (store.Object.Seq); a
	// fleet front's, which come from shards, by their content
	// (chunksByContent, store.HashContent).
	gzipChunks *gzipchunks.Scope
	// watchListChunks keeps, under the same rule and budget, the
	// compressed chunks of gzipped JSON watch-lists' initial events
	// (watchWriter.initialEvents).
	watchListChunks *gzipchunks.Scope
	// chunksByContent: the Source's items have no Seqs (a fleet's
	// front): its bodies hand items to the chunks one at a time as they
	// arrive (gzipchunks.Stream; streamList, initialEventsByContent).
	chunksByContent bool
	printer         tables.Printer
	// tableFailed records a Table that could not be built.
	tableFailed func(error)
	GVR         schema.GroupVersionResource
	APIResource metav1.APIResource
	label       string // metrics label
}

// New builds the handler.
func New(opts Options) *Server {
	s := &Server{
		opts:      opts,
		resources: map[schema.GroupVersionResource]*resource{},
		infos:     &request.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")},
	}
	budget := opts.ProtobufCacheBytes
	if budget == 0 {
		budget = encoding_.DefaultCacheBytes
	}
	pb := encoding_.NewProtobuf(budget, func(path string) { opts.Metrics.ProtobufConversions.WithLabelValues(path).Inc() })
	bodies := newBodyWriters()
	var chunks *gzipchunks.Cache // made for the first resource that keeps chunks
	var list []*resource
	for _, r := range opts.Resources {
		res := &resource{Resource: r, protobuf: pb, bodies: bodies, printer: r.Printer, GVR: r.Entry.Resource.GVR, APIResource: r.Entry.APIResource, label: r.Entry.Resource.String()}
		if res.printer == nil {
			res.printer = tables.Default(res.GVR.GroupResource())
		}
		// Kept chunks are keyed by Seqs, which are unique within one
		// Store: a Source reading its own Store for the life of the
		// Server uses them; a fleet's front, whose items come from the
		// shards, keys its chunks by the items' content instead
		// (gzipchunks.Stream).
		if opts.ListGzipCacheBytes >= 0 {
			if chunks == nil {
				chunks = gzipchunks.New(opts.ListGzipCacheBytes, gzipchunks.Metrics{
					Chunks: opts.Metrics.ListGzipChunks, Bytes: opts.Metrics.ListGzipBytes, Evictions: opts.Metrics.ListGzipEvictions,
				})
			}
			res.gzipChunks = chunks.Scope(res.label)
			res.watchListChunks = chunks.StreamScope(res.label)
			_, own := r.Source.(LocalSource)
			res.chunksByContent = !own
		}
		// At 0 from the start even where no chunks are kept (a cache
		// budget below 0): the dashboard shows "no hits", not "no data".
		for _, result := range []string{"hit", "miss"} {
			opts.Metrics.ListGzipChunks.WithLabelValues(res.label, result)
		}
		for _, field := range r.Entry.FieldIndexes {
			opts.Metrics.IndexedLists.WithLabelValues(res.label, field)
		}
		// The series exists from the start (at 0): dashboards and alerts
		// see "no errors", not "no data".
		tableErrors := opts.Metrics.TableErrors.WithLabelValues(res.label)
		res.tableFailed = func(err error) {
			tableErrors.Inc()
			opts.Log.Error(err, "cannot build a Table", "resource", res.label)
		}
		s.resources[res.GVR] = res
		list = append(list, res)
	}
	s.discovery = newDiscovery(list)
	return s
}

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	path, prefix := s.opts.Paths.Strip(r.URL.Path)
	if prefix == s.opts.Paths.Root && prefix != "" && (path == "" || path == "/") {
		// The aggregator's own discovery of our group/version: the
		// profile's API group has no resources of its own, everything is
		// served below it under the ordinary Kubernetes paths.
		writeJSON(w, http.StatusOK, metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: s.opts.Paths.GroupVersion(), APIResources: []metav1.APIResource{},
		})
		return
	}
	if strings.HasPrefix(path, "/openapi/") && s.opts.OpenAPI != nil {
		s.opts.OpenAPI.ServeOpenAPI(w, r, path, prefix)
		return
	}
	switch path {
	case "/version":
		if s.opts.Version != nil {
			writeJSON(w, http.StatusOK, s.opts.Version)
			return
		}
	case "/healthz", "/livez":
		_, _ = w.Write([]byte("ok"))
		return
	case "/readyz":
		s.serveReady(w)
		return
	}
	if r.Method == http.MethodGet {
		if _, ok := s.discovery.serve(w, path); ok {
			return
		}
	}
	req := r.Clone(r.Context())
	req.URL.Path = path
	info, err := s.infos.NewRequestInfo(req)
	if err != nil || !info.IsResourceRequest {
		writeError(w, notFound())
		return
	}
	res, ok := s.resources[schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource}]
	if !ok || info.Subresource != "" || (!res.APIResource.Namespaced && info.Namespace != "" && info.Resource != "namespaces") {
		writeError(w, notFound())
		return
	}
	var code int
	switch info.Verb {
	case "get":
		code = s.serveGet(w, req, res, info)
	case "list":
		// A large LIST runs on a thread of lower priority (package
		// bulkthread; priority and fairness marks which).
		bulkthread.Counted(req.Context(), s.opts.Metrics.BulkRequests, s.opts.Log, func() {
			code = s.serveList(w, req, res, info)
		})
	case "watch":
		code = s.serveWatch(w, req, res, info, start)
	default:
		code = writeError(w, readOnly(info.Verb, res.label))
	}
	codeLabel := strconv.Itoa(code)
	if code == codeAborted {
		codeLabel = "aborted"
	}
	s.opts.Metrics.Requests.WithLabelValues(info.Verb, res.label, codeLabel).Inc()
	s.opts.Metrics.RequestDuration.WithLabelValues(info.Verb, res.label).Observe(time.Since(start).Seconds())
	if code == codeAborted {
		// Reset the connection (HTTP/1.1) or stream (HTTP/2): the body
		// sent so far must not look complete (streamList).
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) serveReady(w http.ResponseWriter) {
	for _, r := range s.resources {
		select {
		case <-r.Source.Synced():
		default:
			http.Error(w, "cache for "+r.label+" is not synced yet", http.StatusServiceUnavailable)
			return
		}
	}
	if s.opts.OpenAPI != nil {
		if err := s.opts.OpenAPI.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = w.Write([]byte("ok"))
}

// freshnessContext bounds a freshness wait.
func (s *Server) freshnessContext(ctx context.Context) (context.Context, context.CancelFunc) {
	t := s.opts.FreshnessTimeout
	if t <= 0 {
		t = 3 * time.Second
	}
	return context.WithTimeout(ctx, t)
}

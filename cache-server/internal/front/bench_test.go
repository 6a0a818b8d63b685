package front

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/cache-server/internal/auth"
	"github.com/cachetier/cachetier/cache-server/internal/catalog"
	"github.com/cachetier/cachetier/cache-server/internal/fields"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
	"github.com/cachetier/cachetier/internal/pki"
)

// The benchmarks in this file serve LISTs through Server.ServeHTTP with
// everything below the HTTP server real: the front (routing, Accept
// negotiation, listparams, ready(), store.List, encodeList, the response
// write), the ingester (watch-list ingestion through DecodeObject and
// Store.Replace, the consistent-read RV fetch and WaitFresh) and the store
// (4 hash shards, 150 s history window, as hack/bench's profile). Only the
// apiserver is fake: an httptest server on loopback that streams the
// initial watch-list and answers the RV fetch's watch with its
// initial-events-end bookmark, as kube-apiserver does. Not covered: TLS,
// the auth filter (delegated authn/authz), and the client's read of the
// body (the response goes into an httptest.ResponseRecorder whose buffer is
// reused between iterations, so its growth is not counted).

// fakeAPIServer serves the watch requests an Ingester makes for one
// resource: the watch-list of objs (ADDED events and the initial-events-end
// bookmark, then an open stream until the client goes away) and the
// consistent RV fetch (only the bookmark).
type fakeAPIServer struct {
	objs [][]byte
	rv   uint64
}

func bookmark(rv uint64) []byte {
	return fmt.Appendf(nil, `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"%d","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", rv)
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("watch") != "1" || q.Get("sendInitialEvents") != "true" {
		http.Error(w, "fake apiserver: only watch-lists", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if strings.HasPrefix(q.Get("fieldSelector"), "metadata.name=") {
		_, _ = w.Write(bookmark(f.rv))
		return
	}
	for _, o := range f.objs {
		_, _ = w.Write([]byte(`{"type":"ADDED","object":`))
		_, _ = w.Write(o)
		_, _ = w.Write([]byte("}\n"))
	}
	_, _ = w.Write(bookmark(f.rv))
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// benchObjects are n ConfigMaps with size bytes of data as kube-apiserver
// sends them in watch events (kind and apiVersion first, a managedFields
// entry as a client's create leaves it): about 1395 bytes for size 1024,
// the JSON size hack/bench reports for its small set.
func benchObjects(n, size int) [][]byte {
	payload := strings.Repeat("x", size)
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-%06d","namespace":"bench","uid":"0c3c9f55-4f2a-4d8f-9d5e-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-21T10:00:00Z","managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-11-21T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:payload":{}}}}]},"data":{"payload":%q}}`,
			i, i, 1000+i, payload)
	}
	return out
}

type benchTier struct {
	srv      *Server
	metrics  *metrics.Metrics
	ing      *upstream.Ingester
	apiURL   string
	jsonSize int
	stop     func()
}

// newBenchTier starts a fake apiserver with n objects of size bytes and a
// tier (ingester, store, front) synced from it.
func newBenchTier(tb testing.TB, objs [][]byte) *benchTier {
	return newBenchTierFields(tb, objs, true, false)
}

// newBenchTierFields is newBenchTier; withFields=false ingests without a
// FieldsFunc (no field-set read of each object), which is what a resource
// whose field selectors are only metadata.name/namespace could do;
// withHub adds the watch hub standalone wires in, so the Server serves
// watches too.
func newBenchTierFields(tb testing.TB, objs [][]byte, withFields, withHub bool) *benchTier {
	return newBenchTierOf(tb, objs, configMapsResource, withFields, withHub)
}

// benchResource is the resource a bench tier caches.
type benchResource struct {
	resource, kind string
	// indexes are the profile's fieldIndexes (nil: none); the apiserver's
	// own are added as catalog.Resolve does, unless noIndexes.
	indexes   []string
	noIndexes bool
}

var configMapsResource = benchResource{resource: "configmaps", kind: "ConfigMap"}

// newBenchTierOf is newBenchTierFields for a resource of the core group.
func newBenchTierOf(tb testing.TB, objs [][]byte, br benchResource, withFields, withHub bool) *benchTier {
	tb.Helper()
	api := &fakeAPIServer{objs: objs, rv: uint64(1000 + len(objs))}
	hs := httptest.NewServer(api)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: br.resource}
	res := upstream.Resource{GVR: gvr, Kind: br.kind, Namespaced: true}
	fr, err := fields.New(fields.Spec{GVR: gvr, Kind: br.kind, Namespaced: true})
	if err != nil {
		tb.Fatal(err)
	}
	indexes := br.indexes
	for _, f := range fr.APIServerIndexes() {
		if !br.noIndexes && !slices.Contains(indexes, f) {
			indexes = append(indexes, f)
		}
	}
	st, err := store.New(store.Options{Shards: 4, HistoryWindow: 150 * time.Second, Indexes: indexes})
	if err != nil {
		tb.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	fieldsOf := func(raw []byte) map[string]string {
		set, err := fr.SetJSON(raw)
		if err != nil {
			return nil
		}
		return set
	}
	if !withFields {
		fieldsOf = nil
	}
	opts := upstream.Options{
		Resource: res, Host: hs.URL, Client: hs.Client(), Store: st, Metrics: m, Log: logr.Discard(),
		// As standalone wires it: the fields package computes the set.
		Fields: fieldsOf,
		// As a shard's: the fleet-shaped servers over this store
		// (localStreamer, copyingStreamer) hand items over with the
		// hashes shards send; the standalone paths do not read them.
		ContentHashes: true,
	}
	var hub *watch.Hub
	if withHub {
		hub = watch.New(watch.Options{Resource: br.resource, Store: st, Metrics: m, Log: logr.Discard()})
		opts.OnEvents, opts.OnRelist, opts.OnProgress = hub.Publish, hub.Relist, hub.Progress
	}
	ing := upstream.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	go ing.Run(ctx)
	select {
	case <-ing.Synced():
	case <-time.After(5 * time.Minute): // 50k pods on a loaded machine
		tb.Fatal("ingester did not sync")
	}
	srv := New(Options{
		Resources: []Resource{{
			Entry: catalog.Entry{
				Resource:     res,
				APIResource:  metav1.APIResource{Name: br.resource, Kind: br.kind, Namespaced: true, Verbs: []string{"get", "list", "watch"}},
				Fields:       fr,
				FieldIndexes: indexes,
			},
			Source: LocalSource{Ingester: ing},
			Hub:    hub,
		}},
		Metrics: m, Log: logr.Discard(),
	})
	size := 0
	for _, o := range objs {
		size += len(o)
	}
	stop := func() {
		if hub != nil {
			hub.Close()
		}
		cancel()
		hs.CloseClientConnections()
		hs.Close()
	}
	return &benchTier{srv: srv, metrics: m, ing: ing, apiURL: hs.URL, jsonSize: size / max(len(objs), 1), stop: stop}
}

// get serves one request into rec (whose Body buffer is reused).
func (t *benchTier) get(tb testing.TB, body *bytes.Buffer, target string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Accept", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	body.Reset()
	rec := httptest.NewRecorder()
	rec.Body = body
	t.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		tb.Fatalf("GET %s: %d %s", target, rec.Code, body.String())
	}
	return rec
}

const benchPath = "/api/v1/namespaces/bench/configmaps"

func benchServeList(b *testing.B, n, size int, query string, header http.Header) {
	t := newBenchTier(b, benchObjects(n, size))
	defer t.stop()
	body := &bytes.Buffer{}
	// Warm-up; the plain body's size is what MB/s is computed from (a
	// compressed body is much smaller than the list it carries).
	t.get(b, body, benchPath+query, nil)
	plain := body.Len()
	t.get(b, body, benchPath+query, header)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t.get(b, body, benchPath+query, header)
	}
	b.SetBytes(int64(plain))
	b.ReportMetric(float64(body.Len()), "wireB/op")
}

// Consistent full LIST (resourceVersion unset): includes the RV fetch from
// the (fake, loopback) apiserver.
func BenchmarkServeListConsistent10kx1KiB(b *testing.B) { benchServeList(b, 10000, 1024, "", nil) }

// The same LIST at resourceVersion=0: no RV fetch; the difference to the
// consistent one is what the RV round trip costs.
func BenchmarkServeListRV0_10kx1KiB(b *testing.B) {
	benchServeList(b, 10000, 1024, "?resourceVersion=0", nil)
}

// A client that accepts gzip (Go's http.Client does by default).
func BenchmarkServeListConsistentGzip10kx1KiB(b *testing.B) {
	benchServeList(b, 10000, 1024, "", http.Header{"Accept-Encoding": {"gzip"}})
}

func BenchmarkServeListConsistent50x1MiB(b *testing.B) { benchServeList(b, 50, 1<<20, "", nil) }

func BenchmarkServeListConsistentGzip50x1MiB(b *testing.B) {
	benchServeList(b, 50, 1<<20, "", http.Header{"Accept-Encoding": {"gzip"}})
}

// Paginated LIST, limit=500, following continue to the end (the first page
// is a consistent read, the others are served from its snapshot).
func BenchmarkServeListPaginated10kx1KiB(b *testing.B) {
	t := newBenchTier(b, benchObjects(10000, 1024))
	defer t.stop()
	body := &bytes.Buffer{}
	walk := func() int {
		pages, q := 0, "?limit=500"
		for {
			t.get(b, body, benchPath+q, nil)
			pages++
			var l struct {
				Metadata struct {
					Continue string `json:"continue"`
				} `json:"metadata"`
			}
			// Only the metadata is needed: decode the head of the body.
			head := body.Bytes()
			if i := bytes.Index(head, []byte(`,"items":`)); i > 0 {
				head = append(head[:i:i], '}')
			}
			if err := json.Unmarshal(head, &l); err != nil {
				b.Fatal(err)
			}
			if l.Metadata.Continue == "" {
				return pages
			}
			q = "?limit=500&continue=" + url.QueryEscape(l.Metadata.Continue)
		}
	}
	walk()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if pages := walk(); pages != 20 {
			b.Fatalf("%d pages", pages)
		}
	}
}

// BenchmarkIngestMemory10kx1KiB reports the live heap per stored object
// after a watch-list load of 10k ConfigMaps (after GC, the fake apiserver's
// own copy of the JSON excluded), next to the object's JSON size. One
// iteration is one load; run with -benchtime=1x.
func BenchmarkIngestMemory10kx1KiB(b *testing.B) { benchIngestMemory(b, 10000, 1024, true) }

func BenchmarkIngestMemory50x1MiB(b *testing.B) { benchIngestMemory(b, 50, 1<<20, true) }

// Without a FieldsFunc: what skipping the field-set read would save.
func BenchmarkIngestMemoryNoFieldsFunc10kx1KiB(b *testing.B) {
	benchIngestMemory(b, 10000, 1024, false)
}

func benchIngestMemory(b *testing.B, n, size int, withFields bool) {
	objs := benchObjects(n, size)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		t := newBenchTierFields(b, objs, withFields, false)
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n), "loadns/obj")
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&after)
		perObj := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
		b.ReportMetric(perObj, "heapB/obj")
		b.ReportMetric(float64(t.jsonSize), "jsonB/obj")
		b.ReportMetric(perObj/float64(t.jsonSize), "heap/json")
		b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(n), "allocB/obj")
		if p := os.Getenv("CACHETIER_INGEST_HEAP_PROFILE"); p != "" {
			// The live heap while the tier holds the objects (go test's
			// -memprofile is written after the tier is stopped). Pair
			// with -memprofilerate=1 for exact attribution.
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.WriteHeapProfile(f); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
		runtime.KeepAlive(t)
		t.stop()
	}
}

// BenchmarkAuthChainCacheHit is the per-request cost of the auth filter
// (cache-server/internal/auth.Wrap) on its steady-state path: a direct
// client's certificate verified against the cluster's client CA (as
// hack/bench's admin client connects) and a SubjectAccessReview answered
// from the authorizer's cache. The handler behind it does nothing; the
// TLS handshake is not included (connections are kept alive). The
// apiserver is a fake clientset; sars/op shows the cache hits.
func BenchmarkAuthChainCacheHit(b *testing.B) {
	ca, err := pki.NewCA("client-ca")
	if err != nil {
		b.Fatal(err)
	}
	kp, err := ca.IssueClient("admin", []string{"system:masters"})
	if err != nil {
		b.Fatal(err)
	}
	block, _ := pem.Decode(kp.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		b.Fatal(err)
	}
	// A fake apiserver for the two calls the auth chain makes: the
	// authentication ConfigMap at start-up and SubjectAccessReviews.
	var sars atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/configmaps/extension-apiserver-authentication"):
			_ = json.NewEncoder(w).Encode(corev1.ConfigMap{
				TypeMeta:   metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
				ObjectMeta: metav1.ObjectMeta{Name: "extension-apiserver-authentication", Namespace: metav1.NamespaceSystem},
				Data:       map[string]string{"client-ca-file": string(ca.CertPEM)},
			})
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/subjectaccessreviews"):
			sars.Add(1)
			var sar authorizationv1.SubjectAccessReview
			_ = json.NewDecoder(r.Body).Decode(&sar)
			sar.Status.Allowed = true
			_ = json.NewEncoder(w).Encode(sar)
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		b.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	h, _, err := auth.Wrap(context.Background(), auth.Options{Client: cs, CacheTTL: time.Hour}, ok)
	if err != nil {
		b.Fatal(err)
	}
	serve := func() {
		req := httptest.NewRequest(http.MethodGet, benchPath, nil)
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{cert}}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	serve()
	sars.Store(0)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		serve()
	}
	b.ReportMetric(float64(sars.Load())/float64(b.N), "sars/op")
}

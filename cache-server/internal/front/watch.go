package front

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"

	"github.com/cachetier/cachetier/cache-server/internal/bulkthread"
	encoding_ "github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/listparams"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// initialEventsEnd is the annotation on the bookmark that ends a watch-list's
// initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEnd = metav1.InitialEventsAnnotationKey

// minRequestTimeout is kube-apiserver's --min-request-timeout default: a
// watch without timeoutSeconds lasts between one and two times it.
const minRequestTimeout = 1800 * time.Second

// serveWatch serves a WATCH with kube-apiserver's semantics (KEP-2340 watch
// table, KEP-3157 watch-list) from the resource's hub.
//
// As in the apiserver, errors found while parsing the request are HTTP
// errors; once the request is accepted, problems establishing the stream
// (a freshness wait that times out, an RV older than the history) are a
// single in-stream ERROR event on a 200 response (cacher newErrWatcher).
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, res *resource, info *request.RequestInfo, start time.Time) int {
	enc, err := negotiateFor(res, r.Header.Get("Accept"), false)
	if err != nil {
		return writeErrorAs(w, enc, err)
	}
	ns := info.Namespace
	if !res.APIResource.Namespaced {
		ns = ""
	}
	p, err := listparams.Parse(r.URL.Query(), listparams.Watch, listparams.Options{
		Namespace: ns, Name: info.Name, ConvertFieldLabel: res.Entry.Fields.ConvertFieldLabel,
	})
	if err != nil {
		return writeError(w, err)
	}
	if res.Hub == nil {
		return writeError(w, notFound())
	}
	var tableOpts tables.Options
	if enc == encTable {
		if tableOpts, err = tableOptions(r); err != nil {
			return writeError(w, err)
		}
	}
	// The cacher refuses watches with 429 while it (re)initializes.
	if _, err := s.ready(r.Context(), res, listparams.Read{Mode: listparams.ReadAny}); err != nil {
		return writeError(w, err)
	}

	timeout := time.Duration(0)
	if p.TimeoutSeconds != nil {
		timeout = time.Duration(*p.TimeoutSeconds) * time.Second
	}
	if timeout == 0 {
		timeout = time.Duration(float64(minRequestTimeout) * (rand.Float64() + 1))
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	rc := http.NewResponseController(w)
	// The hub may terminate the watcher from another goroutine; the
	// response writer must not be touched once this handler returned.
	var rcMu sync.Mutex
	handlerDone := false
	defer func() {
		rcMu.Lock()
		handlerDone = true
		rcMu.Unlock()
	}()
	// A selector that pins an indexed field (a kubelet's
	// spec.nodeName=<node>) reads only its value's events.
	index, _ := p.IndexValue(res.Entry.FieldIndexes)
	wreq := watch.Request{
		Namespace:      ns,
		Match:          p.Matcher(),
		Selector:       p.SelectorText(),
		BulkNice:       bulkthread.Nice(r.Context()),
		Index:          index,
		AllowBookmarks: p.AllowWatchBookmarks,
		Deadline:       deadline,
		OnTerminate: func() {
			// Unblock a write stuck on a client that does not read.
			rcMu.Lock()
			if !handlerDone {
				_ = rc.SetWriteDeadline(time.Now())
			}
			rcMu.Unlock()
			cancel()
		},
	}
	var setupErr error
	if p.InitialEvents {
		// Watch-list (or legacy RV=""/"0" watch): the snapshot must be as
		// fresh as the request asks, exactly like a LIST.
		if _, err := s.ready(ctx, res, p.Read); err != nil {
			setupErr = err
		} else if err := res.Hub.WaitFor(ctx, res.Source.AppliedRV()); err != nil {
			setupErr = err
		}
		wreq.InitialEvents = true
	} else {
		switch p.Read.Mode {
		case listparams.ReadExact:
			wreq.From = p.Read.RV
		case listparams.ReadConsistent:
			// "Read etcd RV. Watch stream from it."
			fctx, fcancel := s.freshnessContext(ctx)
			rv, err := res.Source.CurrentRV(fctx)
			fcancel()
			if err != nil {
				setupErr = &store.TooLargeResourceVersionError{Current: res.Source.AppliedRV(), Err: err}
			}
			wreq.From = rv
			if rv == 0 {
				wreq.From = res.Hub.LastRV()
			}
		default: // ReadAny: from the current RV of the cache
		}
	}
	var watcher *watch.Watcher
	if setupErr == nil {
		watcher, setupErr = res.Hub.Watch(wreq)
	}

	// A watch-list (the apiserver's isListWatchRequest: sendInitialEvents
	// and allowWatchBookmarks) is gzipped when the client accepts it, from
	// the first byte of the body, an in-stream setup error included (the
	// apiserver serves that through the same writer); see watchBody.
	body := res.bodies.watchBody(w, rc, p.InitialEventsEndBookmark && acceptsGzip(r))
	// Ends an unfinished gzip member and returns the compressor to its
	// pool however the stream ends (client gone, timeout, terminated as
	// too slow, hub closed); before handlerDone is set.
	defer body.Close()
	ww := &watchWriter{s: s, w: body, res: res, enc: enc, table: tableOpts}
	ct := enc.contentType()
	if enc.isProtobuf() {
		ct += ";stream=watch"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush() // the headers only, uncompressed
	if setupErr != nil {
		if errors.Is(setupErr, context.Canceled) && r.Context().Err() != nil {
			return http.StatusOK
		}
		_ = ww.writeError(setupErr)
		_ = body.Flush()
		return http.StatusOK
	}
	defer watcher.Stop()

	if p.InitialEvents {
		// A large watch-list's initial events are a LIST's work, run on a
		// thread of lower priority (package bulkthread); the watch goes
		// on at the process's own.
		var n int
		var werr, err error
		bulkthread.Counted(r.Context(), s.opts.Metrics.BulkRequests, s.opts.Log, func() {
			n, werr, err = ww.initialEvents(watcher, initialCapacity(res, wreq))
		})
		if err != nil || werr != nil {
			if err != nil && werr == nil && !errors.Is(err, watch.ErrTerminated) {
				_ = ww.writeError(err)
			}
			s.logWatchEnd(r, res, enc, "initial events", n, cmp.Or(werr, err))
			return http.StatusOK
		}
		watcher.InitialDone()
		if p.InitialEventsEndBookmark {
			if err := ww.writeBookmark(watcher.SnapshotRV, true); err != nil {
				return http.StatusOK
			}
			s.opts.Metrics.WatchListInitial.WithLabelValues(res.label).Observe(time.Since(start).Seconds())
		}
		// Right after the initial-events-end bookmark, as the apiserver
		// flushes (ending the gzip member of a compressed watch-list).
		// It may also flush within the initial events, whenever its
		// serving goroutine finds the cacher's channel empty; the
		// snapshot here is written in one go, so one member.
		if err := body.Flush(); err != nil {
			return http.StatusOK
		}
	}

	// The watch is established and its initial events, if any, written
	// up to the initial-events-end bookmark: priority and fairness
	// releases the seats it held for that work (the apiserver's cacher
	// signals at the same point). A stream that ended earlier was
	// released when the handler returned.
	utilflowcontrol.WatchInitialized(r.Context())

	var out []watch.Out
	for {
		out, err = watcher.Next(ctx.Done(), out[:0])
		for _, o := range out {
			if o.Type == "BOOKMARK" {
				err = ww.writeBookmark(o.RV, false)
			} else {
				err = ww.writeEvent(o)
			}
			if err != nil {
				s.logWatchEnd(r, res, enc, "events", 0, err)
				return http.StatusOK
			}
		}
		if len(out) > 0 {
			// What was queued has been written: flush, as the apiserver
			// does after an event when its channel is empty (one gzip
			// member per batch for a compressed watch-list).
			if body.Flush() != nil {
				return http.StatusOK
			}
			now := time.Now()
			for _, o := range out {
				if !o.Received.IsZero() {
					s.opts.Metrics.WatchDelivery.WithLabelValues(res.label).Observe(now.Sub(o.Received).Seconds())
				}
			}
		}
		if err != nil || ctx.Err() != nil {
			// Terminated (too slow: the client re-watches from its last
			// RV) or the watch's time is up: end the stream cleanly.
			return http.StatusOK
		}
	}
}

// initialEvents writes the watcher's initial state as ADDED events and
// returns how many it wrote, the write error that ended them (a client
// gone) or the watcher's.
//
// A gzipped JSON watch-list of a resource whose Server keeps compressed
// chunks (res.watchListChunks) is written as one gzip member of chunks kept
// between watch-lists, as a LIST's body is (package gzipchunks): compressing
// every event again was ~70% of the tier's CPU while 64 clients looped
// watch-lists of 10k ConfigMaps (hack/bench -mode flood -profile-dir), and
// client-go's informers open every watch with a watch-list when its
// WatchListClient feature is on — the same unchanged objects, framed the
// same way, at every informer start and relist. The snapshot's objects are
// collected first (pointers to stored objects, as a LIST's items) because
// chunks are cut by looking ahead; the client reads the same bytes, and a
// member boundary before the bookmark's, which its gzip reader joins.
// capacity sizes that collection (initialCapacity).
func (ww *watchWriter) initialEvents(watcher *watch.Watcher, capacity int) (n int, werr, err error) {
	if ww.res.watchListChunks != nil && ww.enc == encJSON && ww.w.compress {
		if ww.res.chunksByContent {
			return ww.initialEventsByContent(watcher)
		}
		objs := make([]*store.Object, 0, capacity)
		if err := watcher.Initial(func(o *store.Object) bool { objs = append(objs, o); return true }); err != nil {
			return 0, nil, err
		}
		if err := ww.w.writeChunks(ww.res.watchListChunks, objs, writeAddedFrame); err != nil {
			return 0, err, nil
		}
		ww.s.opts.Metrics.WatchEvents.WithLabelValues(ww.res.label, "ADDED").Add(float64(len(objs)))
		return len(objs), nil, nil
	}
	err = watcher.Initial(func(o *store.Object) bool {
		if werr = ww.writeEvent(watch.Out{Type: "ADDED", Object: o, RV: o.RV}); werr != nil {
			return false
		}
		n++
		return true
	})
	return n, werr, err
}

// initialCapacity is how many objects an unfiltered watch-list's initial
// state holds (its range's count), to collect them in one allocation:
// grown by appends, the 10,000 pointers of a watch-list of 10,000
// ConfigMaps cost about five times their 80 KB, most of what a standalone
// tier allocated under a flood of such watch-lists. A selector may match
// few of the range, so a filtered one grows as it goes (0).
func initialCapacity(res *resource, req watch.Request) int {
	sizer, ok := res.Source.(Sizer)
	if !ok || req.Match != nil {
		return 0
	}
	n, _ := sizer.Count(req.Namespace, req.Index)
	return int(n)
}

// writeAddedFrame writes o's ADDED event, an item of a watch-list's kept
// chunks.
func writeAddedFrame(dst gzipchunks.ItemWriter, o *store.Object) {
	_ = writeJSONEvent(dst, "ADDED", o.Raw)
}

// logWatchEnd logs a watch stream that ended early while its client was
// still connected: an object that could not be encoded, or a watcher the
// hub terminated during its initial events. A client that went away (its
// request context is done) ends streams all the time and is not logged.
// The client sees the stream end; a watch-list client then falls back to
// a LIST, which is worth knowing about.
func (s *Server) logWatchEnd(r *http.Request, res *resource, enc encoding, phase string, sent int, err error) {
	if r.Context().Err() != nil || err == nil {
		return
	}
	s.opts.Log.Info("watch stream ended early", "resource", res.label, "phase", phase, "eventsSent", sent,
		"contentType", enc.contentType(), "userAgent", r.UserAgent(), "err", err.Error())
}

// watchWriter frames events as the apiserver's watch stream: one
// {"type":…,"object":…} JSON document per line, or length-prefixed protobuf
// WatchEvents (framing and object encodings from encode.go).
type watchWriter struct {
	s   *Server
	w   *watchBody
	res *resource
	enc encoding
	// table: the Table options of an encTable stream (tableOptions).
	table tables.Options
}

func (ww *watchWriter) frame(typ string, obj []byte) error {
	var err error
	if ww.enc.isProtobuf() {
		_, err = ww.w.Write(encoding_.WatchFrame(typ, obj))
	} else {
		err = writeJSONEvent(ww.w, typ, obj)
	}
	return ww.sent(typ, err)
}

// writeJSONEvent writes a JSON watch event, {"type":…,"object":…} and a
// newline, around an object's JSON. It is the one place those bytes are
// made: a gzipped watch-list's kept chunks (initialEvents) must hold what
// the event-by-event path writes.
//
// Three writes instead of one concatenated frame: the object is the stored
// bytes, and copying them per event per watcher was the bulk of a
// watch-list's garbage (a 500 KiB Secret to 64 watchers is 32 MiB per
// event). The watchBody gathers the three of a small object into its
// pooled event buffer (eventCoalesceMax) and passes a large object through
// uncopied (the compressor, for a gzipped watch-list, copies all three).
func writeJSONEvent(w io.Writer, typ string, obj []byte) error {
	if _, err := io.WriteString(w, jsonEventHead(typ)); err != nil {
		return err
	}
	if _, err := w.Write(bytes.TrimRight(obj, "\n")); err != nil {
		return err
	}
	_, err := io.WriteString(w, "}\n")
	return err
}

// jsonEventHead is a JSON watch event up to its object; constant for the
// event types a stream carries, so the head costs no allocation per event.
func jsonEventHead(typ string) string {
	switch typ {
	case "ADDED":
		return `{"type":"ADDED","object":`
	case "MODIFIED":
		return `{"type":"MODIFIED","object":`
	case "DELETED":
		return `{"type":"DELETED","object":`
	case "BOOKMARK":
		return `{"type":"BOOKMARK","object":`
	case "ERROR":
		return `{"type":"ERROR","object":`
	}
	return `{"type":` + strconv.Quote(typ) + `,"object":`
}

// sent ends an event: written in one piece (watchBody.EndEvent) and
// counted, or dropped with err.
func (ww *watchWriter) sent(typ string, err error) error {
	if err == nil {
		err = ww.w.EndEvent()
	} else {
		ww.w.dropEvent()
	}
	if err == nil {
		ww.s.opts.Metrics.WatchEvents.WithLabelValues(ww.res.label, typ).Inc()
	}
	return err
}

func (ww *watchWriter) writeEvent(o watch.Out) error {
	obj := o.Object
	if o.RewriteRV {
		raw, err := watch.WithResourceVersion(obj.Raw, o.RV)
		if err != nil {
			return err
		}
		cp := *obj
		cp.Raw = raw
		cp.RV = o.RV
		cp.Seq = 0 // other bytes: not the stored state the Seq names
		obj = &cp
	}
	if ww.enc.isProtobuf() {
		// The cached message goes out as is, between its frame's head
		// and tail (encoding.WatchObjectFrame): no per-watcher copy.
		// A large message is streamed from the JSON for this watcher
		// (encoding.Protobuf.WriteMessage).
		apiVersion, kind := protobufType(ww.res, ww.enc)
		err := ww.res.protobuf.WriteMessage(ww.w, ww.res.GVR.GroupVersion().WithKind(ww.res.APIResource.Kind), obj, ww.enc.isPartialMetadata(),
			func(msgLen int) (head, tail []byte) {
				return encoding_.WatchObjectFrame(o.Type, apiVersion, kind, msgLen)
			})
		return ww.sent(o.Type, err)
	}
	data, err := ww.encodeObject(obj)
	if err != nil {
		if ww.enc == encTable {
			// The client learns why its stream ends (the apiserver, whose
			// printers do not fail on stored objects, has no answer of
			// its own here).
			_ = ww.writeError(err)
		}
		return err
	}
	return ww.frame(o.Type, data)
}

func (ww *watchWriter) encodeObject(o *store.Object) ([]byte, error) {
	if ww.enc == encTable {
		b, err := ww.res.encodeTable(ww.table, []*store.Object{o}, false, metav1.ListMeta{})
		// Only the first Table carries column definitions, as from the
		// apiserver's watch embedded encoder (NoHeaders after it).
		ww.table.NoHeaders = true
		return b, err
	}
	return encodeObject(ww.res, ww.enc, o)
}

// writeBookmark writes a BOOKMARK whose object is the resource's kind (or
// PartialObjectMetadata) with only metadata.resourceVersion and, at the end
// of a watch-list's initial events, the k8s.io/initial-events-end
// annotation.
func (ww *watchWriter) writeBookmark(rv uint64, initialEnd bool) error {
	raw := bookmarkObject(ww.res.APIResource.Kind, ww.res.GVR.GroupVersion().String(), ww.res.Entry.Custom, rv, initialEnd)
	o := &store.Object{Raw: raw, RV: rv}
	var data []byte
	var err error
	if ww.enc == encJSON {
		data = o.Raw
	} else if data, err = ww.encodeObject(o); err != nil {
		return err
	}
	return ww.frame("BOOKMARK", data)
}

// bookmarkObject is a bookmark's object in JSON as kube-apiserver writes
// it: for a built-in kind the typed object's field order (kind,
// apiVersion; in ObjectMeta resourceVersion before annotations); for a
// custom resource an Unstructured's, whose keys encoding/json sorts
// (apiVersion, kind; annotations before resourceVersion).
func bookmarkObject(kind, apiVersion string, custom bool, rv uint64, initialEnd bool) []byte {
	var b bytes.Buffer
	rvField := `"resourceVersion":` + strconv.Quote(formatRV(rv))
	annotations := `"annotations":{` + strconv.Quote(initialEventsEnd) + `:"true"}`
	if custom {
		b.WriteString(`{"apiVersion":` + strconv.Quote(apiVersion) + `,"kind":` + strconv.Quote(kind) + `,"metadata":{`)
		if initialEnd {
			b.WriteString(annotations + ",")
		}
		b.WriteString(rvField + `}}`)
		return b.Bytes()
	}
	b.WriteString(`{"kind":` + strconv.Quote(kind) + `,"apiVersion":` + strconv.Quote(apiVersion) + `,"metadata":{` + rvField)
	if initialEnd {
		b.WriteString("," + annotations)
	}
	b.WriteString(`}}`)
	return b.Bytes()
}

// writeError writes the in-stream ERROR event with the error's Status.
// Inside a protobuf stream the Status is protobuf for the metadata form
// too: the apiserver's embedded encoder is the stream's negotiated
// serializer and passes a Status through untransformed, and client-go's
// metadata client decodes the event's object with protobuf (a JSON Status
// there reached informers as "provided data does not appear to be a
// protobuf message" instead of 410 Expired, so they never relisted).
func (ww *watchWriter) writeError(err error) error {
	st := toStatus(err)
	if ww.enc.isProtobuf() {
		return ww.frame("ERROR", encoding_.Status(st))
	}
	return ww.frame("ERROR", encodeStatus(ww.enc, st))
}

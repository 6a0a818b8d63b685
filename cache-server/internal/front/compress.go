package front

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"

	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Response compression, as kube-apiserver does it
// (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters, feature
// APIResponseCompression, on by default): a GET or LIST response is gzipped
// at level 1 when the request's Accept-Encoding has a "gzip" token and the
// body is larger than 128 KiB; watch streams are not, except watch-lists
// (feature WatchListCompression, see watchBody). Go's http.Client
// (so client-go, kubectl, informers) asks for gzip by default and
// decompresses transparently; the aggregator passes the encoding through.
//
// The tier follows the same rule because a client must not see its LISTs
// grow several-fold on the wire by pointing at the tier (a 10k-ConfigMap
// LIST is 14 MiB plain; through the aggregator to a remote kubectl that is
// the difference that matters). The CPU is the price — most of the tier's
// CPU per LIST — so the encoder is klauspost/compress's: the same format
// and level as compress/gzip in about half the CPU (hack/bench's 10k
// ConfigMaps: 12.3 -> 8.2 ms per LIST in process). On loopback TLS part of
// it is paid back by encrypting far fewer bytes. See docs/benchmarks.md.
const gzipThreshold = 128 * 1024

// streamBufferSize is the write buffer of a streamed body: large enough
// that writes to the connection (or the compressor) are few, small enough
// to pool per request. Items larger than it bypass it (bufio writes them
// through directly when its buffer is empty).
const streamBufferSize = 64 * 1024

// bodyWriters pools what writing a body needs; one per Server, shared by
// its resources.
type bodyWriters struct {
	gzip sync.Pool // *gzip.Writer at level 1
	// watchGzip holds stateless compressors for watch-lists (see
	// watchBody): many streams hold one at the same time, and a level-1
	// compressor keeps ~800 KiB of window and tables where a stateless one
	// keeps ~3 KiB.
	watchGzip sync.Pool
	bufs      sync.Pool // *bufio.Writer of streamBufferSize
	held      sync.Pool // *[]byte of gzipThreshold (deferredBody)
	pages     sync.Pool // *bytes.Buffer: a page's items (streamList)
	events    sync.Pool // *[]byte of eventCoalesceMax (watchBody)
}

// maxPooledPage bounds the page buffers kept for reuse: a page of large
// objects is written from a buffer of its own, not kept.
const maxPooledPage = 4 << 20

func (b *bodyWriters) putPage(page *bytes.Buffer) {
	if page.Cap() > maxPooledPage {
		return
	}
	page.Reset()
	b.pages.Put(page)
}

func newBodyWriters() *bodyWriters {
	return &bodyWriters{
		gzip: sync.Pool{New: func() any {
			gw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // level 1 is valid: no error
			return gw
		}},
		watchGzip: sync.Pool{New: func() any {
			gw, _ := gzip.NewWriterLevel(nil, gzip.StatelessCompression) // a valid level: no error
			return gw
		}},
		bufs:   sync.Pool{New: func() any { return bufio.NewWriterSize(nil, streamBufferSize) }},
		held:   sync.Pool{New: func() any { b := make([]byte, 0, gzipThreshold); return &b }},
		pages:  sync.Pool{New: func() any { return new(bytes.Buffer) }},
		events: sync.Pool{New: func() any { b := make([]byte, 0, eventCoalesceMax); return &b }},
	}
}

// acceptsGzip is the apiserver's ContentEncodingSupported: the first
// Accept-Encoding header, split at commas, has a token that is exactly
// "gzip" once trimmed (parameters such as q-values make it not match, as
// there).
func acceptsGzip(r *http.Request) bool {
	for tok := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		if strings.TrimSpace(tok) == "gzip" {
			return true
		}
	}
	return false
}

// start writes the status line and headers of a 200 response in enc and
// returns where to write the body (buffered; gzip-compressed when compress
// is set, which the caller decides by the apiserver's rule) and the
// function that completes it. Write errors (a client that went away) are
// dropped, as the apiserver drops them, and make the remaining writes
// cheap: bufio.Writer keeps its first error.
func (b *bodyWriters) start(w http.ResponseWriter, compress bool, enc encoding) (itemWriter, func()) {
	w.Header().Set("Content-Type", enc.contentType())
	var z gzipOut
	var dst io.Writer = w
	if compress {
		setGzipHeaders(w.Header())
		z = b.openGzip(w, &b.gzip)
		dst = z.gw
	}
	w.WriteHeader(http.StatusOK)
	bw := b.bufs.Get().(*bufio.Writer)
	bw.Reset(dst)
	return bw, func() {
		_ = bw.Flush()
		bw.Reset(nil) // drop the reference to this response
		b.bufs.Put(bw)
		if compress {
			_ = z.close(false)
		}
	}
}

// writeGzipList writes a gzipped 200 JSON list body from head, items
// (each written by item) and the tail, taking the compressed chunks of
// items that an earlier LIST already compressed from chunks (package
// gzipchunks): most of a large LIST's CPU is compressing, and most objects
// of a large resource did not change since the last LIST of it.
func (b *bodyWriters) writeGzipList(w http.ResponseWriter, chunks *gzipchunks.Scope, head []byte, items []*store.Object, item func(gzipchunks.ItemWriter, *store.Object)) {
	w.Header().Set("Content-Type", encJSON.contentType())
	setGzipHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	out := b.bufs.Get().(*bufio.Writer)
	out.Reset(w)
	zw := chunks.NewWriter(out)
	_, _ = zw.Write(head)
	zw.Items(items, item)
	_, _ = zw.Write([]byte(jsonListTail))
	// A write error is a client gone: nothing to tell it.
	_ = zw.Close()
	_ = out.Flush()
	out.Reset(nil)
	b.bufs.Put(out)
}

// write writes a complete 200 body in enc, compressed by the same rule.
func (b *bodyWriters) write(w http.ResponseWriter, gzipOK bool, enc encoding, body []byte) int {
	if !gzipOK || len(body) <= gzipThreshold {
		return writeBody(w, enc, body)
	}
	w.Header().Set("Content-Type", enc.contentType())
	setGzipHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	z := b.openGzip(w, &b.gzip)
	_, _ = z.gw.Write(body)
	_ = z.close(false)
	return http.StatusOK
}

// deferred returns a 200 body in enc whose bytes are held back until they
// pass gzipThreshold — then the response starts, compressed when gzipOK —
// or until finish, which writes a body that never passed it plain, in one
// piece. That is the apiserver's rule for bodies whose size is not known
// up front (its deferredResponseWriter decides on what its streaming
// encoders buffered), and until the response starts the caller can still
// answer an error instead (discard).
func (b *bodyWriters) deferred(w http.ResponseWriter, gzipOK bool, enc encoding) *deferredBody {
	return &deferredBody{b: b, w: w, gzipOK: gzipOK, enc: enc, held: b.held.Get().(*[]byte)}
}

// deferredBody is a body started by deferred.
type deferredBody struct {
	b      *bodyWriters
	w      http.ResponseWriter
	gzipOK bool
	enc    encoding
	held   *[]byte    // the body so far, until the response starts
	out    itemWriter // the response's body, once started
	done   func()
	// err is the first write error (a client gone); later writes do
	// nothing.
	err error
	// A JSON list of a front writes its items through chunks kept by
	// content once it is compressed (chunkJSON, contentchunks.go).
	chunks      *gzipchunks.Scope
	chunkCustom bool
	chunkPrefix []byte
	stream      *gzipchunks.Stream
	heldItems   int // items held before the response started
}

func (d *deferredBody) Write(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	if d.out == nil {
		if len(*d.held)+len(p) <= gzipThreshold {
			*d.held = append(*d.held, p...)
			return len(p), nil
		}
		d.begin()
		if d.err != nil {
			return 0, d.err
		}
	}
	n, err := d.out.Write(p)
	if err != nil {
		d.err = err
	}
	return n, err
}

func (d *deferredBody) WriteByte(c byte) error {
	if d.out == nil && d.err == nil && len(*d.held) < gzipThreshold {
		*d.held = append(*d.held, c)
		return nil
	}
	_, err := d.Write([]byte{c})
	return err
}

// begin starts the response: the body is longer than gzipThreshold.
func (d *deferredBody) begin() {
	if d.chunks != nil {
		d.beginChunks()
		return
	}
	d.out, d.done = d.b.start(d.w, d.gzipOK, d.enc)
	if _, err := d.out.Write(*d.held); err != nil {
		d.err = err
	}
	d.release()
}

func (d *deferredBody) release() {
	*d.held = (*d.held)[:0]
	d.b.held.Put(d.held)
	d.held = nil
}

// sent reports whether the response has started.
func (d *deferredBody) sent() bool { return d.out != nil }

// finish completes the response and returns the first write error.
func (d *deferredBody) finish() error {
	if d.out == nil {
		writeBody(d.w, d.enc, *d.held)
		d.release()
		return nil
	}
	d.done()
	return d.err
}

// discard drops the body. Before the response started nothing was written
// and the caller can answer otherwise; after, the response must be
// aborted (its writers are left to the collector, not completed).
func (d *deferredBody) discard() {
	if d.out == nil {
		d.release()
	}
}

// setGzipHeaders marks a response gzip-encoded, as the apiserver does.
func setGzipHeaders(h http.Header) {
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
}

// gzipOut is one gzip stream (or member) to a response. The compressor
// emits each block as it completes: a few hundred bytes each for
// compressible lists. Written to an HTTP/2 ResponseWriter as they come,
// every 4 KiB of them is a hand-off to the connection's goroutine, a DATA
// frame, a TLS record and a write(2); collected to streamBufferSize first,
// the server gets few large writes (frames of up to 16 KiB, one syscall
// each).
type gzipOut struct {
	b    *bodyWriters
	pool *sync.Pool // where gw came from and goes back to
	gw   *gzip.Writer
	out  *bufio.Writer
}

// openGzip starts a gzip stream to w with a compressor from pool.
func (b *bodyWriters) openGzip(w io.Writer, pool *sync.Pool) gzipOut {
	z := gzipOut{b: b, pool: pool, gw: pool.Get().(*gzip.Writer), out: b.bufs.Get().(*bufio.Writer)}
	z.out.Reset(w)
	z.gw.Reset(z.out)
	return z
}

// close ends the stream (sync-flushed first when syncFlush, see
// watchBody.endMember), writes it out of the buffer and returns the
// compressor and the buffer to their pools. After an earlier write error
// it returns that error.
func (z gzipOut) close(syncFlush bool) error {
	var err error
	if syncFlush {
		err = z.gw.Flush()
	}
	if err == nil {
		err = z.gw.Close()
	}
	if err == nil {
		err = z.out.Flush()
	}
	z.gw.Reset(nil) // drop the reference to this response
	z.pool.Put(z.gw)
	z.out.Reset(nil)
	z.b.bufs.Put(z.out)
	return err
}

// watchBody is where a watch stream's frames go: the ResponseWriter itself,
// or for a compressed watch-list a sequence of gzip members.
//
// kube-apiserver gzips watch-list responses since 1.37 (feature
// WatchListCompression, beta, on by default; handlers/watch.go
// watchResponseWriter): a watch with sendInitialEvents=true and
// allowWatchBookmarks=true (isListWatchRequest, after the defaulting that
// makes a watch at resourceVersion ""/"0" without resourceVersionMatch one)
// whose Accept-Encoding has a "gzip" token gets Content-Encoding gzip
// whatever its size; other watches never do. The tier
// does the same for the reason it compresses LISTs: a watch-list of large
// objects (what client-go's informers send when WatchListClient is on,
// always with Accept-Encoding gzip) would otherwise be several times larger
// on the wire than from the apiserver, which through the aggregator is the
// difference a remote client sees.
//
// As the apiserver's perFlushGzipWriter, the compressor is taken from the
// pool at the first write after a flush and every Flush ends the gzip
// member (the client's gzip reader reads the members as one stream),
// returns the compressor to the pool and flushes the response: an idle
// watch holds no compression state, and whatever was flushed is decodable
// by the client at once. The compressor's output is collected in a pooled
// streamBufferSize buffer while a member is open (see start).
//
// Unlike the apiserver (compress/gzip level 1), the compressor is
// klauspost's stateless one fed through a streamBufferSize buffer: while 64
// watch-lists stream their initial events at once, a level-1 compressor per
// stream held ~50 MiB (hack/bench -mode watchlist: peak RSS 322 MiB against
// 265 MiB uncompressed); a stateless one holds its input and output
// buffers only. The price is a somewhat lower ratio: each buffer is
// compressed without the window of the one before.
type watchBody struct {
	b        *bodyWriters
	w        http.ResponseWriter
	rc       *http.ResponseController
	compress bool
	in       *bufio.Writer // z's input while a member is open
	z        gzipOut       // the open member; z.gw is nil between flushes
	// event gathers an uncompressed stream's event (EndEvent); nil
	// between events.
	event *[]byte
}

// eventCoalesceMax bounds the events an uncompressed watch stream writes
// to the response in one Write (EndEvent). Why one: the frame is three
// writes (its head, the stored object, its tail), and the HTTP/2
// ResponseWriter buffers only 4 KiB, so a 5 KiB Pod went out as two
// DATA frames, each a round trip to the connection's serving goroutine,
// a TLS record and a write(2); now one. (hack/bench -mode nodes showed no
// CPU change beyond its noise; the frames and syscalls halve.) A larger
// object is written as before, in pieces, without copying it (a 500 KiB
// Secret to 64 watchers).
const eventCoalesceMax = 32 << 10

// watchBody sets the response's encoding headers (before WriteHeader) and
// returns the body writer; compress is the caller's decision by the
// apiserver's rule (a watch-list and acceptsGzip).
func (b *bodyWriters) watchBody(w http.ResponseWriter, rc *http.ResponseController, compress bool) *watchBody {
	if compress {
		setGzipHeaders(w.Header())
	}
	return &watchBody{b: b, w: w, rc: rc, compress: compress}
}

// Write writes p uncompressed or into the open gzip member, starting one if
// none is. p is not retained (the compressor copies it into its window),
// so callers may write stored bytes without copying them.
func (wb *watchBody) Write(p []byte) (int, error) {
	if !wb.compress {
		return gather(wb, p)
	}
	if wb.z.gw == nil {
		wb.z = wb.b.openGzip(wb.w, &wb.b.watchGzip)
		wb.in = wb.b.bufs.Get().(*bufio.Writer)
		wb.in.Reset(wb.z.gw)
	}
	// Through a buffer: the stateless compressor compresses each Write on
	// its own, so the small head and tail of a frame must not reach it
	// alone; objects larger than the buffer go through in one Write.
	return wb.in.Write(p)
}

// gather adds p to the event being written, or writes it through when the
// event would exceed eventCoalesceMax (after what was gathered). A string
// is appended without a conversion.
func gather[T string | []byte](wb *watchBody, p T) (int, error) {
	if wb.event == nil {
		if len(p) > eventCoalesceMax {
			return wb.w.Write([]byte(p))
		}
		wb.event = wb.b.events.Get().(*[]byte)
	}
	if len(*wb.event)+len(p) > eventCoalesceMax {
		if err := wb.EndEvent(); err != nil {
			return 0, err
		}
		return wb.w.Write([]byte(p))
	}
	*wb.event = append(*wb.event, p...)
	return len(p), nil
}

// EndEvent writes the event gathered since the last one in one Write
// (compressed streams: nothing to do, their buffer gathers events). After
// a failed Write the buffer is not reused: HTTP/2 may still be reading it
// (a stream closed while its frame was being written).
func (wb *watchBody) EndEvent() error {
	if wb.event == nil {
		return nil
	}
	buf := wb.event
	wb.event = nil
	if _, err := wb.w.Write(*buf); err != nil {
		return err
	}
	*buf = (*buf)[:0]
	wb.b.events.Put(buf)
	return nil
}

// dropEvent forgets a partly gathered event (its writer failed before
// ending it: the stream ends).
func (wb *watchBody) dropEvent() {
	if wb.event != nil {
		*wb.event = (*wb.event)[:0]
		wb.b.events.Put(wb.event)
		wb.event = nil
	}
}

// writeChunks writes objs, each framed by frame, as a gzip member of its
// own made of the chunks scope keeps (compressing and keeping those it does
// not have yet), after ending any open member. The member's data ends with
// a sync flush (every chunk does), so the client decodes all of it without
// waiting for the next member, as endMember ensures for the others.
func (wb *watchBody) writeChunks(scope *gzipchunks.Scope, objs []*store.Object, frame func(gzipchunks.ItemWriter, *store.Object)) error {
	if len(objs) == 0 {
		return nil
	}
	return wb.chunkMember(scope, func(zw *gzipchunks.Writer) error {
		zw.Items(objs, frame)
		return nil
	})
}

// chunkMember ends any open member and writes one of chunks kept in scope,
// filled by fill; it returns fill's error or the first write error.
func (wb *watchBody) chunkMember(scope *gzipchunks.Scope, fill func(*gzipchunks.Writer) error) error {
	if wb.z.gw != nil {
		if err := wb.endMember(); err != nil {
			return err
		}
	}
	out := wb.b.bufs.Get().(*bufio.Writer)
	out.Reset(wb.w)
	zw := scope.NewWriter(out)
	err := fill(zw)
	if cerr := zw.Close(); err == nil {
		err = cerr
	}
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	out.Reset(nil)
	wb.b.bufs.Put(out)
	return err
}

// WriteString keeps the ResponseWriter's WriteString for plain streams.
func (wb *watchBody) WriteString(s string) (int, error) {
	if !wb.compress {
		return gather(wb, s)
	}
	return wb.Write([]byte(s))
}

// Flush ends the open gzip member, if any, and flushes the response; a
// compressed stream with nothing written since the last flush is left
// alone (the apiserver's perFlushGzipWriter.Flush). A write error (a client
// gone, a write deadline passed) is returned.
func (wb *watchBody) Flush() error {
	if err := wb.EndEvent(); err != nil {
		return err
	}
	if wb.compress {
		if wb.z.gw == nil {
			return nil
		}
		if err := wb.endMember(); err != nil {
			return err
		}
	}
	return wb.rc.Flush()
}

// Close ends the open gzip member, if any, without flushing the response
// (the server completes it when the handler returns), and returns the
// compressor and buffer to their pools. It must be called before the
// handler returns, whatever ended the stream; calling it again does
// nothing.
func (wb *watchBody) Close() error {
	wb.dropEvent()
	if wb.z.gw == nil {
		return nil
	}
	return wb.endMember()
}

// endMember completes the gzip member and writes it out of the buffer;
// after an earlier write error it just returns that error.
//
// The sync flush before Close is what the apiserver does too, and it is
// not redundant: Close alone puts the member's last data in the final
// deflate block, which Go's gzip.Reader (so net/http's transparent
// decompression, client-go) hands out together with the end of the
// member, after it has read the trailer and the next member's header. On
// a live stream that read blocks until the next flush: a client would get
// the initial-events-end bookmark only with the next event. After the
// sync flush the data comes out of an empty non-final stored block and the
// final block carries none.
func (wb *watchBody) endMember() error {
	err := wb.in.Flush()
	wb.in.Reset(nil)
	wb.b.bufs.Put(wb.in)
	wb.in = nil
	if cerr := wb.z.close(true); err == nil {
		err = cerr
	}
	wb.z = gzipOut{}
	return err
}

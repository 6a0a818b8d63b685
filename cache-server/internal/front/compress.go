package front

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// Response compression, as kube-apiserver does it
// (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters, feature
// APIResponseCompression, on by default): a GET or LIST response is gzipped
// at level 1 when the request's Accept-Encoding has a "gzip" token and the
// body is larger than 128 KiB; watch streams never are. Go's http.Client
// (so client-go, kubectl, informers) asks for gzip by default and
// decompresses transparently; the aggregator passes the encoding through.
//
// The tier follows the same rule because a client must not see its LISTs
// grow several-fold on the wire by pointing at the tier (a 10k-ConfigMap
// LIST is 14 MiB plain; through the aggregator to a remote kubectl that is
// the difference that matters). The CPU is the price: level 1 compresses
// hack/bench's ConfigMaps at about 1.2 GB/s and typical JSON at a few
// hundred MB/s; on loopback TLS it is partly paid back by encrypting far
// fewer bytes. See docs/benchmarks.md ("LIST path profile").
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
	bufs sync.Pool // *bufio.Writer of streamBufferSize
}

func newBodyWriters() *bodyWriters {
	return &bodyWriters{
		gzip: sync.Pool{New: func() any {
			gw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // level 1 is valid: no error
			return gw
		}},
		bufs: sync.Pool{New: func() any { return bufio.NewWriterSize(nil, streamBufferSize) }},
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
	h := w.Header()
	h.Set("Content-Type", enc.contentType())
	var gw *gzip.Writer
	var out *bufio.Writer
	var dst io.Writer = w
	if compress {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		// The compressor emits each block as it completes: a few hundred
		// bytes each for compressible lists. Written to an HTTP/2
		// ResponseWriter as they come, every 4 KiB of them is a hand-off
		// to the connection's goroutine, a DATA frame, a TLS record and a
		// write(2). Collected to streamBufferSize first, the server gets
		// few large writes (fewer frames of up to 16 KiB, one syscall
		// each).
		out = b.bufs.Get().(*bufio.Writer)
		out.Reset(w)
		gw = b.gzip.Get().(*gzip.Writer)
		gw.Reset(out)
		dst = gw
	}
	w.WriteHeader(http.StatusOK)
	bw := b.bufs.Get().(*bufio.Writer)
	bw.Reset(dst)
	return bw, func() {
		_ = bw.Flush()
		bw.Reset(nil) // drop the reference to this response
		b.bufs.Put(bw)
		if gw != nil {
			_ = gw.Close()
			gw.Reset(nil)
			b.gzip.Put(gw)
			_ = out.Flush()
			out.Reset(nil)
			b.bufs.Put(out)
		}
	}
}

// write writes a complete 200 body in enc, compressed by the same rule.
func (b *bodyWriters) write(w http.ResponseWriter, gzipOK bool, enc encoding, body []byte) int {
	if !gzipOK || len(body) <= gzipThreshold {
		return writeBody(w, enc, body)
	}
	w.Header().Set("Content-Type", enc.contentType())
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	w.WriteHeader(http.StatusOK)
	out := b.bufs.Get().(*bufio.Writer) // as in start
	out.Reset(w)
	gw := b.gzip.Get().(*gzip.Writer)
	gw.Reset(out)
	_, _ = gw.Write(body)
	_ = gw.Close()
	gw.Reset(nil)
	b.gzip.Put(gw)
	_ = out.Flush()
	out.Reset(nil)
	b.bufs.Put(out)
	return http.StatusOK
}

package front

import (
	"bufio"
	"net/http"

	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/watch"
)

// Gzipped bodies of a fleet's front from chunks kept by content.
//
// A front's items arrive one at a time from the shards' streams and live
// only during the call that passes them on (ItemStreamer, fleet.Source's
// Scan), so the Seq-keyed chunks of a standalone tier (writeGzipList,
// initialEvents) do not apply: the front hands each item to a
// gzipchunks.Stream, which keys chunks by the items' bytes. Under a flood
// of full LISTs compressing was ~60% of a front's CPU (hack/bench -mode
// flood -flood-servers fleet -profile-dir), for objects that had not
// changed since the last LIST of them.

// chunkJSON makes d write a gzipped JSON list's items from chunks kept in
// scope (chunkItem) once the body passes gzipThreshold; items are written
// by writeItemBytes with custom and prefix, as jsonForm writes them. A
// body that is not gzipped (the client does not accept it, or it stays
// under the threshold) is written as without chunks.
func (d *deferredBody) chunkJSON(scope *gzipchunks.Scope, custom bool, prefix []byte) {
	if !d.gzipOK {
		return
	}
	d.chunks, d.chunkCustom, d.chunkPrefix = scope, custom, prefix
}

// chunkItem adds one list item (after a comma when after): held while the
// body is under the threshold, handed to the chunk stream once it passed
// it. The item is never split between the two: the held bytes are the
// body's head and whole items, compressed fresh when the response starts.
// contentHash is the item's, when its shard sent it (else 0: the stream
// hashes the bytes).
func (d *deferredBody) chunkItem(raw []byte, contentHash uint64, after bool) {
	if d.err != nil {
		return
	}
	// Before the response starts there is no stream (begin makes both).
	if d.stream == nil {
		// Exactly the bytes the item adds, so the response is compressed
		// exactly when jsonForm's plain path would compress it.
		n := itemBytesLen(d.chunkCustom, d.chunkPrefix, raw)
		if after {
			n++
		}
		if len(*d.held)+n <= gzipThreshold {
			if after {
				*d.held = append(*d.held, ',')
			}
			writeItemBytes(d, d.chunkCustom, d.chunkPrefix, raw)
			d.heldItems++
			return
		}
		d.begin()
		if d.err != nil {
			return
		}
	}
	if err := d.stream.Add(raw, contentHash); err != nil {
		d.err = err
	}
}

// beginChunks starts a response whose body is written through the chunks:
// the held bytes fresh, then the stream of items, then (Write) the tail.
func (d *deferredBody) beginChunks() {
	h := d.w.Header()
	h.Set("Content-Type", d.enc.contentType())
	setGzipHeaders(h)
	d.w.WriteHeader(http.StatusOK)
	out := d.b.bufs.Get().(*bufio.Writer)
	out.Reset(d.w)
	zw := d.chunks.NewWriter(out)
	custom, prefix := d.chunkCustom, d.chunkPrefix
	d.stream = zw.Stream(func(dst gzipchunks.ItemWriter, o *store.Object) {
		writeItemBytes(dst, custom, prefix, o.Raw)
	}, d.heldItems > 0)
	d.out = chunkedOut{zw}
	d.done = func() {
		// A write error is a client gone: nothing to tell it.
		_ = zw.Close()
		_ = out.Flush()
		out.Reset(nil)
		d.b.bufs.Put(out)
	}
	if _, err := zw.Write(*d.held); err != nil {
		d.err = err
	}
	d.release()
}

// chunkedOut writes fresh bytes (the list's tail) to a chunked body, after
// the items its stream holds.
type chunkedOut struct{ zw *gzipchunks.Writer }

func (c chunkedOut) Write(p []byte) (int, error) { return c.zw.Write(p) }
func (c chunkedOut) WriteByte(b byte) error {
	_, err := c.zw.Write([]byte{b})
	return err
}

// initialEventsByContent is initialEvents for a front: the snapshot's
// ADDED events, handed one at a time as the shards send them, as one gzip
// member of chunks kept by content. Nothing beyond the chunk being
// assembled is held, however large the snapshot, and the objects are read
// from the shards' streams in place (InitialRaw), with the content hashes
// the shards sent: the stream copies what it holds.
func (ww *watchWriter) initialEventsByContent(watcher *watch.Watcher) (n int, werr, err error) {
	werr = ww.w.chunkMember(ww.res.watchListChunks, func(zw *gzipchunks.Writer) error {
		stream := zw.Stream(writeAddedFrame, false)
		var addErr error
		err = watcher.InitialRaw(func(raw []byte, contentHash uint64) bool {
			if addErr = stream.Add(raw, contentHash); addErr != nil {
				return false
			}
			n++
			return true
		})
		return addErr
	})
	ww.s.opts.Metrics.WatchEvents.WithLabelValues(ww.res.label, "ADDED").Add(float64(n))
	return n, werr, err
}

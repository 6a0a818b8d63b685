package front

import (
	"bytes"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
)

// ItemStreamer is a Source that can hand a list's items to the encoder as
// it reads them instead of returning them collected (a fleet's front: the
// shards' streams are merged straight into the response, so the front
// neither copies every object it passes on nor holds a whole list — a
// 100k-object LIST would otherwise be 300 MB of copies per request).
type ItemStreamer interface {
	// StreamItems reads the page of req as List does; it calls head with
	// the page's RV before the first item, then item with each item's
	// stored bytes in key order (valid only during the call) and its
	// content hash (store.Object.ContentHash; 0: not known). The result
	// is List's without Items. An error of head or item ends the read and
	// is returned.
	StreamItems(req store.ListRequest, head func(rv uint64) error, item func(raw []byte, contentHash uint64) error) (store.ListResult, error)
}

// listRead is what streamList needs of the request besides the store's.
type listRead struct {
	ns          string // the namespace read ("" = all)
	continueKey string // the request's continue key
	errEnc      encoding
}

// codeAborted is serveList's answer when a streamed body broke after part
// of it was sent: ServeHTTP aborts the response (see streamList).
const codeAborted = -1

// streamForm writes one form of a LIST body from its items as they
// arrive, in exactly the bytes writeList writes for the collected items.
// Its errors are the conversions' (an object that does not decode or
// print), answered as writeList answers them.
type streamForm interface {
	enc() encoding
	// head is the body up to the first item.
	head(meta metav1.ListMeta) ([]byte, error)
	// item writes one item (after a separator unless it is the first) or
	// holds a copy of it for a batch; raw is valid only during the call.
	// contentHash is the item's store.Object.ContentHash (0: not known),
	// which keys the chunks a front keeps by content (chunkItem).
	item(w itemWriter, raw []byte, contentHash uint64) error
	// flush writes what item holds.
	flush(w itemWriter) error
	// tail ends the body.
	tail() []byte
}

// streamFormFor is the streamForm of a LIST in enc, or nil for the forms
// a fleet front collects (see serveList): protobuf, and the Tables whose
// rows must be printed together (tables.NewList's false) or whose options
// are bad (the collected path answers those after the read, as the
// apiserver does).
func streamFormFor(r *http.Request, res *resource, enc encoding) streamForm {
	switch enc {
	case encJSON:
		return &jsonForm{res: res, prefix: itemPrefix(res)}
	case encPartialMetadata, encPartialMetadataV1beta1:
		return &metadataForm{form: enc, custom: res.Entry.Custom}
	case encTable:
		opts, err := tableOptions(r)
		if err != nil {
			return nil
		}
		// Rows do not depend on the list metadata: the List is started
		// without it and the head is asked for once it is known
		// (HeadFor), after a page's rows.
		l, ok, err := tables.NewList(res.printer, metav1.ListMeta{}, opts)
		if err != nil || !ok {
			return nil
		}
		return &tableForm{res: res, l: l}
	}
	return nil
}

// jsonForm is the JSON list: the items' stored bytes (writeJSONList).
type jsonForm struct {
	res    *resource
	prefix []byte
	n      int
}

func (f *jsonForm) enc() encoding { return encJSON }
func (f *jsonForm) head(meta metav1.ListMeta) ([]byte, error) {
	return jsonListHead(f.res.APIResource.Kind+"List", f.res.GVR.GroupVersion().String(), meta)
}

func (f *jsonForm) item(w itemWriter, raw []byte, contentHash uint64) error {
	if d, ok := w.(*deferredBody); ok && d.chunks != nil {
		d.chunkItem(raw, contentHash, f.n > 0)
		f.n++
		return nil
	}
	if f.n > 0 {
		_ = w.WriteByte(',')
	}
	f.n++
	writeItemBytes(w, f.res.Entry.Custom, f.prefix, raw)
	return nil
}
func (f *jsonForm) flush(itemWriter) error { return nil }
func (f *jsonForm) tail() []byte           { return []byte(jsonListTail) }

// metadataForm is the JSON PartialObjectMetadataList: each item is
// partialMetadata's, cut from its stored bytes. The apiserver builds the
// list by appending to a nil slice, so an empty one is "items":null, not
// []: the head ends before the bracket, which the first item opens.
type metadataForm struct {
	form   encoding // its version
	custom bool     // writePartialMetadata's
	n      int
}

func (f *metadataForm) enc() encoding { return f.form }
func (f *metadataForm) head(meta metav1.ListMeta) ([]byte, error) {
	h, err := jsonListHead("PartialObjectMetadataList", f.form.metaAPIVersion(), meta)
	return bytes.TrimSuffix(h, []byte("[")), err
}

func (f *metadataForm) item(w itemWriter, raw []byte, _ uint64) error {
	sep := byte(',')
	if f.n == 0 {
		sep = '['
	}
	_ = w.WriteByte(sep)
	f.n++
	return writePartialMetadata(w, f.form.metaAPIVersion(), raw, f.custom)
}
func (f *metadataForm) flush(itemWriter) error { return nil }
func (f *metadataForm) tail() []byte {
	if f.n == 0 {
		return []byte("null}\n")
	}
	return []byte(jsonListTail)
}

// tableForm is the Table: rows printed a batch of tables.ListBatch items
// at a time. The batch's items are copied (a streamed item's bytes live
// only during its call): the form holds one batch of objects, not the
// list.
type tableForm struct {
	res   *resource
	l     *tables.List
	arena []byte   // the batch's items' bytes
	raws  [][]byte // the batch: slices of arena
	ends  []int
}

func (f *tableForm) enc() encoding { return encTable }
func (f *tableForm) head(meta metav1.ListMeta) ([]byte, error) {
	h, err := f.l.HeadFor(meta)
	return h, f.res.tableError(err)
}

func (f *tableForm) item(w itemWriter, raw []byte, _ uint64) error {
	f.arena = append(f.arena, raw...)
	f.ends = append(f.ends, len(f.arena))
	if len(f.ends) < tables.ListBatch {
		return nil
	}
	return f.flush(w)
}

func (f *tableForm) flush(w itemWriter) error {
	if len(f.ends) == 0 {
		return nil
	}
	// Sliced once the batch is complete: arena may have moved as it grew.
	f.raws = f.raws[:0]
	start := 0
	for _, end := range f.ends {
		f.raws = append(f.raws, f.arena[start:end:end])
		start = end
	}
	f.arena, f.ends = f.arena[:0], f.ends[:0]
	if err := f.l.WriteRows(w, f.raws); err != nil {
		return f.res.tableError(err)
	}
	return nil
}

func (f *tableForm) tail() []byte { return append(f.l.Tail(), '\n') }

// streamList serves a LIST in form from src: JSON, JSON
// PartialObjectMetadataList and Table (streamFormFor).
//
// A list without limit is written item by item as it arrives (a Table a
// batch of rows at a time). Its body is held back until it passes the
// gzip threshold (deferredBody), so a list that fails early — a shard
// unreachable, an expired RV, an object that does not print — still gets
// its Status. A failure after part of the body was sent cannot: the
// response is aborted (codeAborted: the connection or HTTP/2 stream is
// reset), so the client sees a broken response, never a well-formed list
// missing items. kube-apiserver's streaming list encoders end the same
// way when they fail half-way.
//
// A page (limit) needs its continue token before its items, and the token
// is known only once the page is read: its items are encoded as they
// arrive into a pooled buffer (the page's body, not its objects), and
// written after the head.
func (s *Server) streamList(w http.ResponseWriter, r *http.Request, res *resource, src ItemStreamer, req store.ListRequest, form streamForm, lr listRead) int {
	// formErr is a conversion's error (not the source's): answered in the
	// form's encoding as writeList answers it, where the source's errors
	// are the read's (listError, in the error encoding).
	var formErr error
	failed := func(err error) int {
		if formErr != nil {
			return writeErrorAs(w, form.enc(), formErr)
		}
		return writeErrorAs(w, lr.errEnc, listError(err, lr.continueKey))
	}
	if req.Limit > 0 {
		page := res.bodies.pages.Get().(*bytes.Buffer)
		defer res.bodies.putPage(page)
		result, err := src.StreamItems(req, nil, func(raw []byte, contentHash uint64) error {
			formErr = form.item(page, raw, contentHash)
			return formErr
		})
		if err == nil {
			formErr = form.flush(page)
			err = formErr
		}
		if err != nil {
			return failed(err)
		}
		head, err := form.head(listMeta(result, lr.ns))
		if err != nil {
			formErr = err
			return failed(err)
		}
		tail := form.tail()
		gz := acceptsGzip(r) && len(head)+page.Len()+len(tail) > gzipThreshold
		dst, done := res.bodies.start(w, gz, form.enc())
		_, _ = dst.Write(head)
		_, _ = dst.Write(page.Bytes())
		_, _ = dst.Write(tail)
		done()
		return http.StatusOK
	}
	body := res.bodies.deferred(w, acceptsGzip(r), form.enc())
	if jf, ok := form.(*jsonForm); ok && res.chunksByContent && res.gzipChunks != nil {
		body.chunkJSON(res.gzipChunks, res.Entry.Custom, jf.prefix)
	}
	items := 0
	_, err := src.StreamItems(req, func(rv uint64) error {
		// Without a limit there is no continue token: the head is known.
		head, err := form.head(listMeta(store.ListResult{RV: rv}, lr.ns))
		if err != nil {
			formErr = err
			return err
		}
		_, err = body.Write(head)
		return err
	}, func(raw []byte, contentHash uint64) error {
		items++
		if formErr = form.item(body, raw, contentHash); formErr != nil {
			return formErr
		}
		return body.err
	})
	if err == nil {
		formErr = form.flush(body)
		err = formErr
	}
	if err == nil {
		_, _ = body.Write(form.tail())
		// A write error here is a client that went away: nothing to tell
		// it (the apiserver drops these too).
		_ = body.finish()
		return http.StatusOK
	}
	body.discard()
	if !body.sent() {
		return failed(err)
	}
	s.opts.Log.Info("aborting a streamed LIST that failed after part of it was sent",
		"resource", res.label, "form", form.enc().String(), "items", items, "err", err.Error())
	return codeAborted
}

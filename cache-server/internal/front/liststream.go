package front

import (
	"bytes"
	"net/http"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// ItemStreamer is a Source that can hand a list's items to the encoder as
// it reads them instead of returning them collected (a fleet's front: the
// shards' streams are merged straight into the response, so the front
// neither copies every object it passes on nor holds a whole list — a
// 100k-object LIST would otherwise be 300 MB of copies per request).
type ItemStreamer interface {
	// StreamItems reads the page of req as List does; it calls head with
	// the page's RV before the first item, then item with each item's
	// stored bytes in key order (valid only during the call). The result
	// is List's without Items. An error of head or item ends the read and
	// is returned.
	StreamItems(req store.ListRequest, head func(rv uint64) error, item func(raw []byte) error) (store.ListResult, error)
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

// streamList serves a JSON LIST from src.
//
// A list without limit is written item by item as it arrives. Its body is
// held back until it passes the gzip threshold (deferredBody), so a list
// that fails early — a shard unreachable, an expired RV — still gets its
// Status. A failure after part of the body was sent cannot: the response
// is aborted (codeAborted: the connection or HTTP/2 stream is reset), so
// the client sees a broken response, never a well-formed list missing
// items. kube-apiserver's streaming list encoders end the same way when
// they fail half-way.
//
// A page (limit) needs its continue token before its items, and the token
// is known only once the page is read: its items are collected as they
// will be written, in a pooled buffer, and written after the head.
func (s *Server) streamList(w http.ResponseWriter, r *http.Request, res *resource, src ItemStreamer, req store.ListRequest, lr listRead) int {
	prefix := itemPrefix(res)
	if req.Limit > 0 {
		page := res.bodies.pages.Get().(*bytes.Buffer)
		defer res.bodies.putPage(page)
		items := 0
		result, err := src.StreamItems(req, nil, func(raw []byte) error {
			if items > 0 {
				_ = page.WriteByte(',')
			}
			items++
			writeItemBytes(page, res.Entry.Custom, prefix, raw)
			return nil
		})
		if err != nil {
			return writeErrorAs(w, lr.errEnc, listError(err, lr.continueKey))
		}
		head, err := jsonListHead(res.APIResource.Kind+"List", res.GVR.GroupVersion().String(), listMeta(result, lr.ns))
		if err != nil {
			return writeErrorAs(w, lr.errEnc, err)
		}
		gz := acceptsGzip(r) && len(head)+page.Len()+len(jsonListTail) > gzipThreshold
		dst, done := res.bodies.start(w, gz, encJSON)
		_, _ = dst.Write(head)
		_, _ = dst.Write(page.Bytes())
		_, _ = dst.Write([]byte(jsonListTail))
		done()
		return http.StatusOK
	}
	body := res.bodies.deferred(w, acceptsGzip(r), encJSON)
	items := 0
	_, err := src.StreamItems(req, func(rv uint64) error {
		// Without a limit there is no continue token: the head is known.
		head, err := jsonListHead(res.APIResource.Kind+"List", res.GVR.GroupVersion().String(), listMeta(store.ListResult{RV: rv}, lr.ns))
		if err != nil {
			return err
		}
		_, err = body.Write(head)
		return err
	}, func(raw []byte) error {
		if items > 0 {
			_ = body.WriteByte(',')
		}
		items++
		writeItemBytes(body, res.Entry.Custom, prefix, raw)
		return body.err
	})
	if err == nil {
		_, _ = body.Write([]byte(jsonListTail))
		// A write error here is a client that went away: nothing to tell
		// it (the apiserver drops these too).
		_ = body.finish()
		return http.StatusOK
	}
	body.discard()
	if !body.sent() {
		return writeErrorAs(w, lr.errEnc, listError(err, lr.continueKey))
	}
	s.opts.Log.Info("aborting a streamed LIST that failed after part of it was sent",
		"resource", res.label, "items", items, "err", err.Error())
	return codeAborted
}

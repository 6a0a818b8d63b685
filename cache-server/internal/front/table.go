package front

import (
	"errors"
	"mime"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"

	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
)

// Table responses (encTable): the front only gathers the stored objects
// and the request's options; package tables builds the Table as the
// apiserver does.

// tableOptions are the Table options of a request: the Table's group
// version from the Accept clause that asked for it, the rest from the
// query (400 for a bad includeObject, as the apiserver answers).
func tableOptions(r *http.Request) (tables.Options, error) {
	opts := tables.Options{GroupVersion: metav1.SchemeGroupVersion}
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		_, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || params["as"] != "Table" || params["g"] != metav1.GroupName {
			continue
		}
		if params["v"] == metav1beta1.SchemeGroupVersion.Version {
			opts.GroupVersion = metav1beta1.SchemeGroupVersion
		}
		break
	}
	var err error
	opts.TableOptions, err = tables.ParseOptions(r.URL.Query())
	return opts, err
}

// encodeTable is the Table of items (one object unless list) as a JSON
// body. A Table that cannot be built is counted and logged with the
// resource; its error is the response's Status.
func (res *resource) encodeTable(opts tables.Options, items []*store.Object, list bool, meta metav1.ListMeta) ([]byte, error) {
	raws := make([][]byte, len(items))
	for i, o := range items {
		raws[i] = o.Raw
	}
	t, err := res.printer.Table(raws, list, meta, opts)
	if err != nil {
		return nil, res.tableError(err)
	}
	return marshalLine(t)
}

// writeTableObject writes the Table of a GET (one object).
func writeTableObject(w http.ResponseWriter, r *http.Request, res *resource, o *store.Object) int {
	opts, err := tableOptions(r)
	if err != nil {
		return writeError(w, err)
	}
	body, err := res.encodeTable(opts, []*store.Object{o}, false, metav1.ListMeta{})
	if err != nil {
		return writeError(w, err)
	}
	return res.bodies.write(w, acceptsGzip(r), encTable, body)
}

// writeTable writes the Table of a LIST a batch of rows at a time
// (tables.List): the request holds one batch's decoded objects and rows,
// not the whole Table. The body is held back until it passes the gzip
// threshold (deferredBody), so an object that cannot be printed early on
// still gets its Status; one found after part of the body was sent
// returns sent, and the caller aborts the response. The printers whose
// rows depend on each other (tables.NewList's false) get their Table built
// whole, as before: their resources are a few dozen objects.
func writeTable(w http.ResponseWriter, r *http.Request, res *resource, opts tables.Options, items []*store.Object, meta metav1.ListMeta) (sent bool, err error) {
	l, ok, err := tables.NewList(res.printer, meta, opts)
	if err != nil {
		return false, res.tableError(err)
	}
	if !ok {
		body, err := res.encodeTable(opts, items, true, meta)
		if err != nil {
			return false, err
		}
		res.bodies.write(w, acceptsGzip(r), encTable, body)
		return true, nil
	}
	body := res.bodies.deferred(w, acceptsGzip(r), encTable)
	_, _ = body.Write(l.Head())
	raws := make([][]byte, 0, min(len(items), tables.ListBatch))
	for len(items) > 0 {
		batch := items[:min(len(items), tables.ListBatch)]
		items = items[len(batch):]
		raws = raws[:0]
		for _, o := range batch {
			raws = append(raws, o.Raw)
		}
		if err := l.WriteRows(body, raws); err != nil {
			body.discard()
			return body.sent(), res.tableError(err)
		}
	}
	_, _ = body.Write(l.Tail())
	_, _ = body.Write([]byte{'\n'})
	// A write error is a client gone: nothing to tell it.
	_ = body.finish()
	return true, nil
}

// tableError records a Table that could not be built (a stored object the
// printer cannot read) with the resource and returns err.
func (res *resource) tableError(err error) error {
	var conv *tables.ConversionError
	if errors.As(err, &conv) {
		res.tableFailed(err)
	}
	return err
}

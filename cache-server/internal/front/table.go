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

// writeTableWhole writes a Table built whole: a GET's (one object), and
// a LIST's that streamFormFor does not stream — bad options (their 400),
// and the printers whose rows depend on each other (tables.NewList's
// false), whose resources are a few dozen objects.
func writeTableWhole(w http.ResponseWriter, r *http.Request, res *resource, items []*store.Object, list bool, meta metav1.ListMeta) int {
	opts, err := tableOptions(r)
	if err != nil {
		return writeError(w, err)
	}
	body, err := res.encodeTable(opts, items, list, meta)
	if err != nil {
		return writeError(w, err)
	}
	return res.bodies.write(w, acceptsGzip(r), encTable, body)
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

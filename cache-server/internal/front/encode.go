package front

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// encoding is the response form a client asked for.
type encoding int

const (
	encJSON encoding = iota
	encPartialMetadata
	encTable
)

// negotiate picks the response form from the Accept header, as the
// apiserver does for JSON clients: plain objects, PartialObjectMetadata(List)
// for metadata-only clients, and Table for kubectl's server-side printing.
// Protobuf is not served yet; a client offering JSON as well (client-go
// does) gets JSON, one accepting only protobuf gets 406.
func negotiate(accept string, list bool) (encoding, error) {
	if strings.TrimSpace(accept) == "" {
		return encJSON, nil
	}
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		if mt != "application/json" && mt != "*/*" && mt != "application/*" {
			continue
		}
		as := params["as"]
		if as == "" {
			return encJSON, nil
		}
		if params["g"] != "meta.k8s.io" || (params["v"] != "v1" && params["v"] != "v1beta1") {
			continue
		}
		switch {
		case as == "Table":
			return encTable, nil
		case as == "PartialObjectMetadata" && !list, as == "PartialObjectMetadataList" && list:
			return encPartialMetadata, nil
		}
	}
	return 0, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", schemaGR(), "", "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", 0, false)
}

func formatRV(rv uint64) string { return strconv.FormatUint(rv, 10) }

// itemBytes is an object as a LIST item. Typed lists of built-in resources
// carry no kind/apiVersion per item; the stored bytes (from watch events)
// start with exactly that TypeMeta, so it is cut off without decoding.
// Custom resources keep it, as the apiserver's unstructured lists do.
func itemBytes(res *resource, o *store.Object) []byte {
	if res.Entry.Custom {
		return o.Raw
	}
	prefix := `{"kind":` + strconv.Quote(res.APIResource.Kind) + `,"apiVersion":` + strconv.Quote(res.GVR.GroupVersion().String())
	if !bytes.HasPrefix(o.Raw, []byte(prefix)) {
		return o.Raw
	}
	rest := o.Raw[len(prefix):]
	if len(rest) > 0 && rest[0] == ',' {
		rest = rest[1:]
	}
	out := make([]byte, 0, len(rest)+1)
	out = append(out, '{')
	return append(out, rest...)
}

func writeObject(w http.ResponseWriter, res *resource, enc encoding, o *store.Object) int {
	switch enc {
	case encPartialMetadata:
		md, err := partialMetadata(o)
		if err != nil {
			return writeError(w, err)
		}
		return writeRaw(w, md)
	case encTable:
		tbl, err := table(res, metav1.ListMeta{}, []*store.Object{o})
		if err != nil {
			return writeError(w, err)
		}
		writeJSON(w, http.StatusOK, tbl)
		return http.StatusOK
	}
	return writeRaw(w, o.Raw)
}

func writeList(w http.ResponseWriter, res *resource, enc encoding, meta metav1.ListMeta, items []*store.Object) int {
	if enc == encTable {
		tbl, err := table(res, meta, items)
		if err != nil {
			return writeError(w, err)
		}
		writeJSON(w, http.StatusOK, tbl)
		return http.StatusOK
	}
	kind, apiVersion := res.APIResource.Kind+"List", res.GVR.GroupVersion().String()
	if enc == encPartialMetadata {
		kind, apiVersion = "PartialObjectMetadataList", "meta.k8s.io/v1"
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return writeError(w, err)
	}
	var buf bytes.Buffer
	buf.WriteString(`{"kind":` + strconv.Quote(kind) + `,"apiVersion":` + strconv.Quote(apiVersion) + `,"metadata":`)
	buf.Write(metaJSON)
	buf.WriteString(`,"items":[`)
	for i, o := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		if enc == encPartialMetadata {
			md, err := partialMetadata(o)
			if err != nil {
				return writeError(w, err)
			}
			buf.Write(md)
			continue
		}
		buf.Write(itemBytes(res, o))
	}
	buf.WriteString("]}\n")
	return writeRaw(w, buf.Bytes())
}

func writeRaw(w http.ResponseWriter, body []byte) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return http.StatusOK
}

// partialMetadata renders an object as PartialObjectMetadata: its metadata
// bytes as stored, wrapped in the meta.k8s.io TypeMeta.
func partialMetadata(o *store.Object) ([]byte, error) {
	var m struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(o.Raw, &m); err != nil {
		return nil, err
	}
	out := []byte(`{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":`)
	out = append(out, m.Metadata...)
	return append(out, '}'), nil
}

// table is the apiserver's default table (no type-specific printers): the
// Name and Created At columns, with each row's object as metadata.
func table(res *resource, meta metav1.ListMeta, items []*store.Object) (*metav1.Table, error) {
	docs := metav1.ObjectMeta{}.SwaggerDoc()
	t := &metav1.Table{
		TypeMeta: metav1.TypeMeta{Kind: "Table", APIVersion: "meta.k8s.io/v1"},
		ListMeta: meta,
		ColumnDefinitions: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string", Format: "name", Description: docs["name"]},
			{Name: "Created At", Type: "date", Description: docs["creationTimestamp"]},
		},
		Rows: []metav1.TableRow{},
	}
	for _, o := range items {
		var m struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(o.Raw, &m); err != nil {
			return nil, err
		}
		md, err := partialMetadata(o)
		if err != nil {
			return nil, err
		}
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells:  []any{m.Metadata.Name, m.Metadata.CreationTimestamp.Time.UTC().Format(time.RFC3339)},
			Object: runtimeRaw(md),
		})
	}
	return t, nil
}

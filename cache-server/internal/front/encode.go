package front

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	encoding_ "github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/gzipchunks"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Encoder API of the front (GET, LIST, and watch streams).
//
// Every response body is built from stored bytes by these functions; callers
// never marshal objects themselves:
//
//	enc, err := negotiateFor(res, accept, list) // Accept header -> encoding
//	errEnc := errorEncoding(accept)             // the encoding of error bodies
//	b, err := encodeObject(res, enc, o)         // one object as a GET returns it; also
//	                                            // what a watch event's "object" carries
//	code := s.writeList(w, r, res, enc, meta, items) // a LIST body, streamed in every form
//	b := encodeStatus(enc, st)                  // an error body (Status) in enc
//	enc.contentType()                           // the response Content-Type
//	writeErrorAs(w, errEnc, err)                // writeError in the error encoding
//	writeJSONEvent(w, "ADDED", b)              // one JSON watch event around encodeObject's bytes
//
// No LIST body is built whole: writeList writes every form as it encodes
// it, so a request holds the objects it lists and a fixed buffer, not a
// body-sized allocation (see writeList).
//
// Encodings: JSON (the stored bytes), JSON PartialObjectMetadata(List),
// Table (built by package tables, see table.go), and — for built-in types only — protobuf (the "k8s\x00" envelope
// around runtime.Unknown, per-object messages converted lazily from the
// stored JSON and cached per *store.Object in a byte-bounded LRU, see
// package encoding) and protobuf PartialObjectMetadata(List) (also for
// custom resources, as the apiserver does). The apiserver serves no
// protobuf for custom resources nor protobuf Tables; the answers to those
// Accept headers are its own (406, or JSON when the client offers it).
//
// negotiate(accept, list) is the JSON-only negotiation kept for callers
// that have no resource at hand; it never returns a protobuf encoding.

// encoding is the response form a client asked for.
type encoding int

const (
	encJSON encoding = iota
	encPartialMetadata
	encTable
	// encProtobuf is the typed object (list) in protobuf; built-in types only.
	encProtobuf
	// encProtobufPartialMetadata is PartialObjectMetadata(List) in protobuf.
	encProtobufPartialMetadata
	// The same two forms in meta.k8s.io/v1beta1, which the apiserver
	// still serves to clients that ask for it.
	encPartialMetadataV1beta1
	encProtobufPartialMetadataV1beta1
)

// contentType is the response Content-Type of an encoding.
func (e encoding) contentType() string {
	if e.isProtobuf() {
		return encoding_.ProtobufMediaType
	}
	return "application/json"
}

// String names the encoding in logs.
func (e encoding) String() string {
	switch e {
	case encPartialMetadata:
		return "PartialObjectMetadata"
	case encTable:
		return "Table"
	case encProtobuf:
		return "protobuf"
	case encProtobufPartialMetadata:
		return "protobuf PartialObjectMetadata"
	case encPartialMetadataV1beta1:
		return "PartialObjectMetadata v1beta1"
	case encProtobufPartialMetadataV1beta1:
		return "protobuf PartialObjectMetadata v1beta1"
	}
	return "JSON"
}

func (e encoding) isProtobuf() bool {
	return e == encProtobuf || e == encProtobufPartialMetadata || e == encProtobufPartialMetadataV1beta1
}

// isPartialMetadata: PartialObjectMetadata(List), JSON or protobuf, either
// version.
func (e encoding) isPartialMetadata() bool {
	switch e {
	case encPartialMetadata, encProtobufPartialMetadata, encPartialMetadataV1beta1, encProtobufPartialMetadataV1beta1:
		return true
	}
	return false
}

// metaAPIVersion is the apiVersion of a PartialObjectMetadata(List) form.
func (e encoding) metaAPIVersion() string {
	if e == encPartialMetadataV1beta1 || e == encProtobufPartialMetadataV1beta1 {
		return "meta.k8s.io/v1beta1"
	}
	return "meta.k8s.io/v1"
}

// listFormat is how a protobuf list of e numbers its fields.
func (e encoding) listFormat() encoding_.ListFormat {
	if e == encProtobufPartialMetadataV1beta1 {
		return encoding_.ListItemsFirst
	}
	return encoding_.ListMetaFirst
}

// notAcceptableProtobuf is the apiserver's 406 message for a protobuf form
// it cannot produce (a custom resource, a Table).
const notAcceptableProtobuf = "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"

// negotiateFor picks the response form for res from the Accept header, in
// the order the clauses are given (q-values are ignored). With res nil,
// protobuf clauses are skipped. On error, the returned encoding is the one
// to write the error in; callers use errorEncoding for all errors.
func negotiateFor(res *resource, accept string, list bool) (encoding, error) {
	if strings.TrimSpace(accept) == "" {
		return encJSON, nil
	}
	sawProtobuf, sawPlainProtobuf := false, false
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		as := params["as"]
		metaGV := params["g"] == "meta.k8s.io" && (params["v"] == "v1" || params["v"] == "v1beta1")
		if mt == encoding_.ProtobufMediaType && res != nil {
			sawProtobuf = true
			switch {
			case as == "":
				sawPlainProtobuf = true
				if protobufSupported(res) {
					return encProtobuf, nil
				}
			case !metaGV:
			case as == "PartialObjectMetadata" && !list, as == "PartialObjectMetadataList" && list:
				if params["v"] == "v1beta1" {
					return encProtobufPartialMetadataV1beta1, nil
				}
				return encProtobufPartialMetadata, nil
			}
			continue
		}
		if mt != "application/json" && mt != "*/*" && mt != "application/*" {
			continue
		}
		if as == "" {
			return encJSON, nil
		}
		if !metaGV {
			continue
		}
		switch {
		case as == "Table":
			return encTable, nil
		case as == "PartialObjectMetadata" && !list, as == "PartialObjectMetadataList" && list:
			if params["v"] == "v1beta1" {
				return encPartialMetadataV1beta1, nil
			}
			return encPartialMetadata, nil
		}
	}
	if sawPlainProtobuf && !protobufSupported(res) {
		return encProtobuf, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", schemaGR(), "", notAcceptableProtobuf, 0, false)
	}
	if sawProtobuf {
		return encJSON, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", schemaGR(), "", notAcceptableProtobuf, 0, false)
	}
	return encJSON, apierrors.NewGenericServerResponse(http.StatusNotAcceptable, "get", schemaGR(), "", "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", 0, false)
}

// errorEncoding is how the apiserver encodes a Status for this Accept
// header: the first clause naming a plain (no "as=") form decides, so a
// protobuf client gets protobuf errors even for a custom resource whose
// objects it gets in JSON; metadata-only and Table clauses never apply to a
// Status, and without a plain clause errors are JSON.
func errorEncoding(accept string) encoding {
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil || params["as"] != "" {
			continue
		}
		switch mt {
		case encoding_.ProtobufMediaType:
			return encProtobuf
		case "application/json", "*/*", "application/*":
			return encJSON
		}
	}
	return encJSON
}

// protobufSupported: built-in types client-go's scheme can encode.
func protobufSupported(res *resource) bool {
	if res == nil || res.Entry.Custom {
		return false
	}
	return encoding_.Supports(res.GVR.GroupVersion().WithKind(res.APIResource.Kind))
}

func formatRV(rv uint64) string { return strconv.FormatUint(rv, 10) }

// itemPrefix is the TypeMeta prefix of stored built-in objects. Typed
// lists carry no kind/apiVersion per item and the stored bytes (from watch
// events) start with exactly this, so writeItem cuts it off without
// decoding; custom resources keep it, as the apiserver's unstructured lists do.
func itemPrefix(res *resource) []byte {
	return []byte(`{"kind":` + strconv.Quote(res.APIResource.Kind) + `,"apiVersion":` + strconv.Quote(res.GVR.GroupVersion().String()))
}

// itemWriter is where list items are written: a bytes.Buffer for a body
// built in memory, a bufio.Writer for one streamed to the client.
type itemWriter interface {
	Write(p []byte) (int, error)
	WriteByte(c byte) error
}

// writeItem appends itemBytes(res, o) to w without an intermediate copy.
// itemLen must stay in step with it.
func writeItem(w itemWriter, custom bool, prefix []byte, o *store.Object) {
	writeItemBytes(w, custom, prefix, o.Raw)
}

// writeItemBytes is writeItem for an object's stored bytes.
func writeItemBytes(w itemWriter, custom bool, prefix []byte, raw []byte) {
	if custom || !bytes.HasPrefix(raw, prefix) {
		_, _ = w.Write(raw)
		return
	}
	rest := raw[len(prefix):]
	if len(rest) > 0 && rest[0] == ',' {
		rest = rest[1:]
	}
	_ = w.WriteByte('{')
	_, _ = w.Write(rest)
}

// itemLen is the number of bytes writeItem writes for o.
func itemLen(custom bool, prefix []byte, o *store.Object) int {
	return itemBytesLen(custom, prefix, o.Raw)
}

// itemBytesLen is the number of bytes writeItemBytes writes for raw.
func itemBytesLen(custom bool, prefix []byte, raw []byte) int {
	if custom || !bytes.HasPrefix(raw, prefix) {
		return len(raw)
	}
	rest := raw[len(prefix):]
	if len(rest) > 0 && rest[0] == ',' {
		rest = rest[1:]
	}
	return 1 + len(rest)
}

// jsonListHead is a JSON list body up to its first item.
func jsonListHead(kind, apiVersion string, meta metav1.ListMeta) ([]byte, error) {
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 0, 64+len(kind)+len(apiVersion)+len(metaJSON))
	head = append(head, `{"kind":`...)
	head = strconv.AppendQuote(head, kind)
	head = append(head, `,"apiVersion":`...)
	head = strconv.AppendQuote(head, apiVersion)
	head = append(head, `,"metadata":`...)
	head = append(head, metaJSON...)
	return append(head, `,"items":[`...), nil
}

const jsonListTail = "]}\n"

// jsonListLen is the exact length of the body writeJSONList writes, so a
// body built in memory is allocated once at its final size.
func jsonListLen(res *resource, head []byte, items []*store.Object) int {
	n := len(head) + len(jsonListTail) + max(len(items)-1, 0)
	prefix := itemPrefix(res)
	for _, o := range items {
		n += itemLen(res.Entry.Custom, prefix, o)
	}
	return n
}

// jsonListLonger reports whether the body writeJSONList writes is longer
// than n bytes. It stops as soon as it is: each item costs a look at the
// head of its stored bytes (a cache miss per object), so a full pass
// before streaming showed up in profiles of paginated LISTs.
func jsonListLonger(res *resource, head []byte, items []*store.Object, n int) bool {
	size := len(head) + len(jsonListTail) + max(len(items)-1, 0)
	if size > n {
		return true
	}
	prefix := itemPrefix(res)
	for _, o := range items {
		if size += itemLen(res.Entry.Custom, prefix, o); size > n {
			return true
		}
	}
	return false
}

// writeJSONList writes a JSON list body of stored objects: the head, the
// items' stored bytes (TypeMeta cut, see itemBytes) and the tail.
func writeJSONList(w itemWriter, res *resource, head []byte, items []*store.Object) {
	_, _ = w.Write(head)
	prefix := itemPrefix(res)
	for i, o := range items {
		if i > 0 {
			_ = w.WriteByte(',')
		}
		writeItem(w, res.Entry.Custom, prefix, o)
	}
	_, _ = w.Write([]byte(jsonListTail))
}

// errTableEncoding: Tables need the request's options and are built by
// package tables (tableForm, writeTableWhole, resource.encodeTable), not here.
var errTableEncoding = errors.New("front: Table bodies are built by encodeTable")

// encodeObject is one object in enc: the body of a GET, and the "object"
// of a watch event (for protobuf the enveloped object, which a protobuf
// watch frame embeds as is).
func encodeObject(res *resource, enc encoding, o *store.Object) ([]byte, error) {
	switch enc {
	case encPartialMetadata, encPartialMetadataV1beta1:
		return partialMetadata(o, enc.metaAPIVersion(), res.Entry.Custom)
	case encTable:
		return nil, errTableEncoding
	case encProtobuf, encProtobufPartialMetadata, encProtobufPartialMetadataV1beta1:
		apiVersion, kind, msg, err := protobufMessage(res, enc, o)
		if err != nil {
			return nil, err
		}
		return encoding_.Envelope(apiVersion, kind, msg), nil
	}
	return o.Raw, nil
}

// protobufMessage is o's protobuf message in a protobuf enc (from the
// front's cache when warm) and the type its envelope names.
func protobufMessage(res *resource, enc encoding, o *store.Object) (apiVersion, kind string, msg []byte, err error) {
	apiVersion, kind = protobufType(res, enc)
	if enc.isPartialMetadata() {
		msg, err = res.protobuf.Metadata(o)
		return apiVersion, kind, msg, err
	}
	msg, err = res.protobuf.Object(res.GVR.GroupVersion().WithKind(res.APIResource.Kind), o)
	return apiVersion, kind, msg, err
}

// protobufType is what a protobuf enc's envelope names.
func protobufType(res *resource, enc encoding) (apiVersion, kind string) {
	if enc.isPartialMetadata() {
		return enc.metaAPIVersion(), "PartialObjectMetadata"
	}
	return res.GVR.GroupVersion().String(), res.APIResource.Kind
}

// encodeStatus is an error body in enc: protobuf clients of the typed form
// get a protobuf Status, everyone else JSON (as from the apiserver, whose
// metadata-only protobuf answers carry JSON errors).
func encodeStatus(enc encoding, st metav1.Status) []byte {
	if enc == encProtobuf {
		return encoding_.Status(st)
	}
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	b, _ := marshalLine(st)
	return b
}

// writeErrorAs writes err as a Status in enc (see writeError).
func writeErrorAs(w http.ResponseWriter, enc encoding, err error) int {
	if enc != encProtobuf {
		return writeError(w, err)
	}
	st := toStatus(err)
	if st.Details != nil && st.Details.RetryAfterSeconds > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	}
	w.Header().Set("Content-Type", enc.contentType())
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(encodeStatus(enc, st))
	return int(st.Code)
}

func writeObject(w http.ResponseWriter, r *http.Request, res *resource, enc encoding, o *store.Object) int {
	if enc == encTable {
		return writeTableWhole(w, r, res, []*store.Object{o}, false, metav1.ListMeta{})
	}
	body, err := encodeObject(res, enc, o)
	if err != nil {
		return writeErrorAs(w, enc, err)
	}
	if (enc == encJSON || enc == encPartialMetadata || enc == encPartialMetadataV1beta1) && !bytes.HasSuffix(body, []byte("\n")) {
		// The apiserver's JSON serializer ends the body with a newline (as
		// json.Encoder does). body may be the stored bytes: append to a copy.
		body = append(body[:len(body):len(body)], '\n')
	}
	return res.bodies.write(w, acceptsGzip(r), enc, body)
}

// writeList writes a LIST body, streamed in every form: a request holds
// the stored objects it lists (a snapshot shares them with the store), one
// item's encoding and a fixed buffer (streamBufferSize, and until the body
// passes gzipThreshold the deferredBody's hold) — never a body-sized
// allocation. Built whole, a 10k x 1.4 KiB list allocated (and
// page-faulted and zeroed) 14 MiB per request and a 300 x 1 MiB one 300
// MiB, and a client reading slowly held it until the request deadline.
//
//   - JSON: the stored bytes, through gzipchunks when compressed.
//   - protobuf (typed and PartialObjectMetadataList): two passes over the
//     per-object messages, see writeProtobufList.
//   - JSON PartialObjectMetadataList: each object's metadata cut from its
//     stored bytes as it is written.
//   - Table: package tables prints a batch of rows at a time (tableForm;
//     the printers whose rows depend on each other: writeTableWhole).
//
// A form that fails half-way (an object that does not decode or print)
// answers its Status while nothing was sent; once part of the body was,
// the response is aborted (codeAborted), as streamList's are: the client
// sees a broken response, never a well-formed list missing items.
func (s *Server) writeList(w http.ResponseWriter, r *http.Request, res *resource, enc encoding, meta metav1.ListMeta, items []*store.Object) int {
	var sent bool
	var err error
	switch enc {
	case encJSON:
		head, err := jsonListHead(res.APIResource.Kind+"List", res.GVR.GroupVersion().String(), meta)
		if err != nil {
			return writeErrorAs(w, enc, err)
		}
		gz := acceptsGzip(r) && jsonListLonger(res, head, items, gzipThreshold)
		// Items keys chunks by Store Seq: only for a resource read from
		// its own Store (a front's scope is keyed by content).
		if gz && res.gzipChunks != nil && !res.chunksByContent {
			prefix := itemPrefix(res)
			res.bodies.writeGzipList(w, res.gzipChunks, head, items, func(dst gzipchunks.ItemWriter, o *store.Object) {
				writeItem(dst, res.Entry.Custom, prefix, o)
			})
			return http.StatusOK
		}
		dst, done := res.bodies.start(w, gz, enc)
		writeJSONList(dst, res, head, items)
		done()
		return http.StatusOK
	case encTable, encPartialMetadata, encPartialMetadataV1beta1:
		form := streamFormFor(r, res, enc)
		if form == nil {
			return writeTableWhole(w, r, res, items, true, meta)
		}
		sent, err = writeFormList(w, r, res, form, meta, items)
	default:
		sent, err = writeProtobufList(w, r, res, enc, meta, items)
	}
	if err == nil {
		return http.StatusOK
	}
	if !sent {
		return writeErrorAs(w, enc, err)
	}
	s.opts.Log.Info("aborting a LIST that failed after part of it was sent",
		"resource", res.label, "form", enc.String(), "items", len(items), "err", err.Error())
	return codeAborted
}

// writeProtobufList writes a protobuf list body (the typed list or
// PartialObjectMetadataList) from the per-object messages, without
// assembling it. The envelope's raw field is length-prefixed, so the
// items' total length is needed before the first byte: a first pass finds
// each message's length (from the cache, or converting it) and keeps
// nothing but the sum; the second writes each message. When the cache
// holds the list's messages (the common case: informers relist what
// watches already converted) both passes are lookups. When it cannot —
// the list's messages exceed the cache's budget, or messages are large
// enough never to be cached (encoding.LargeMessageBytes) — the second pass
// converts again: CPU traded for memory, deliberately, since the
// alternative is holding every message of the list (the whole body) per
// request, multiplied by concurrent LISTs and slow readers, which is what
// this bound exists to prevent. Conversion errors surface in the first
// pass, before anything is sent, so they keep their Status; the second
// pass fails only if a message converts differently the second time,
// which aborts the response.
func writeProtobufList(w http.ResponseWriter, r *http.Request, res *resource, enc encoding, meta metav1.ListMeta, items []*store.Object) (sent bool, err error) {
	mb, err := meta.Marshal()
	if err != nil {
		return false, err
	}
	gvk := res.GVR.GroupVersion().WithKind(res.APIResource.Kind)
	metadataOnly, format := enc.isPartialMetadata(), enc.listFormat()
	itemsLen := 0
	for _, o := range items {
		n, err := res.protobuf.MessageLen(gvk, o, metadataOnly)
		if err != nil {
			return false, err
		}
		itemsLen += encoding_.ListItemLen(n)
	}
	apiVersion, kind := protobufType(res, enc)
	head, end := encoding_.ListHead(apiVersion, kind+"List", mb, itemsLen, format), encoding_.ListEnd(mb, format)
	total := len(head) + itemsLen + len(end)
	out, done := res.bodies.start(w, acceptsGzip(r) && total > gzipThreshold, enc)
	dst := &droppingWriter{w: out}
	_, _ = dst.Write(head)
	scratch := make([]byte, 0, 16)
	written := 0
	for _, o := range items {
		n, err := res.protobuf.WriteListItem(dst, gvk, o, metadataOnly, format, &scratch)
		if err != nil {
			return true, err
		}
		if written += encoding_.ListItemLen(n); written > itemsLen {
			return true, fmt.Errorf("protobuf list of %s: item %s converted to %d bytes after the length pass", res.label, o.Key, n)
		}
	}
	if written != itemsLen {
		return true, fmt.Errorf("protobuf list of %s: items are %d bytes, %d declared", res.label, written, itemsLen)
	}
	_, _ = dst.Write(end)
	done()
	return true, nil
}

// droppingWriter drops write errors, as the other bodies do (a client that
// went away: nothing to tell it), so that an error a writer returns is a
// conversion's. bufio.Writer keeps its first error and does nothing after.
type droppingWriter struct{ w itemWriter }

func (d *droppingWriter) Write(p []byte) (int, error) {
	_, _ = d.w.Write(p)
	return len(p), nil
}

func (d *droppingWriter) WriteByte(c byte) error {
	_ = d.w.WriteByte(c)
	return nil
}

// writeFormList writes collected items in form (streamFormFor), the same
// bytes streamList writes for them as they arrive. The body is held back
// until it passes the gzip threshold (deferredBody), which also keeps the
// Status of an object that does not decode or print early on. (tableForm
// copies each batch's items, which only streamed items need: a memcpy
// next to printing them.)
func writeFormList(w http.ResponseWriter, r *http.Request, res *resource, form streamForm, meta metav1.ListMeta, items []*store.Object) (sent bool, err error) {
	head, err := form.head(meta)
	if err != nil {
		return false, err
	}
	body := res.bodies.deferred(w, acceptsGzip(r), form.enc())
	_, _ = body.Write(head)
	for _, o := range items {
		if err = form.item(body, o.Raw, o.ContentHash); err != nil {
			break
		}
	}
	if err == nil {
		err = form.flush(body)
	}
	if err != nil {
		body.discard()
		return body.sent(), err
	}
	_, _ = body.Write(form.tail())
	// A write error is a client gone: nothing to tell it.
	_ = body.finish()
	return true, nil
}

func writeBody(w http.ResponseWriter, enc encoding, body []byte) int {
	w.Header().Set("Content-Type", enc.contentType())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return http.StatusOK
}

func marshalLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// partialMetadata renders an object as PartialObjectMetadata: its metadata
// bytes as stored, wrapped in the meta.k8s.io TypeMeta.
func partialMetadata(o *store.Object, apiVersion string, custom bool) ([]byte, error) {
	var out bytes.Buffer
	if err := writePartialMetadata(&out, apiVersion, o.Raw, custom); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// writePartialMetadata writes the PartialObjectMetadata (of apiVersion) of
// an object's stored bytes to w; nothing when they do not decode.
//
// A built-in object's metadata is stored as the apiserver's typed
// ObjectMeta wrote it, so it is copied as is. A custom resource is stored
// as unstructured JSON, whose keys are sorted; the apiserver's answer
// (meta.AsPartialObjectMetadata) is the typed ObjectMeta, in struct
// order, so the custom resource's is decoded into one and encoded again.
func writePartialMetadata(w io.Writer, apiVersion string, raw []byte, custom bool) error {
	var m struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	if custom && len(m.Metadata) > 0 {
		var om metav1.ObjectMeta
		if err := json.Unmarshal(m.Metadata, &om); err != nil {
			return err
		}
		b, err := json.Marshal(&om)
		if err != nil {
			return err
		}
		m.Metadata = b
	}
	_, _ = io.WriteString(w, `{"kind":"PartialObjectMetadata","apiVersion":"`)
	_, _ = io.WriteString(w, apiVersion)
	_, _ = io.WriteString(w, `","metadata":`)
	_, _ = w.Write(m.Metadata)
	_, _ = w.Write([]byte{'}'})
	return nil
}

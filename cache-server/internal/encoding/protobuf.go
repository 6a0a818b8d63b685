// Package encoding turns stored objects (JSON bytes, see package store) into
// the kube-apiserver's protobuf wire format.
//
// The apiserver answers a client asking for application/vnd.kubernetes.protobuf
// with the "k8s\x00" magic followed by a runtime.Unknown whose TypeMeta names
// the kind and whose Raw is the object's generated protobuf message. A list is
// the same envelope around <Kind>List{metadata = 1: ListMeta, items = 2:
// repeated <Kind>}, so a list is assembled from per-object messages without
// building a typed list.
//
// An object's message is converted from its JSON by package jsonproto (a
// per-type plan read from the Go types' tags; no typed object, output the
// only allocation), falling back to the typed conversion (JSON -> Go object
// via client-go's scheme -> Marshal) for JSON the plan does not fit.
// Conversions are done lazily and small results are cached per stored
// object: a message read by many watchers is converted once. Large messages
// (LargeMessageBytes and up) are not cached: holding them would keep a
// second copy of the largest objects' data next to their JSON, and the plan
// converts them at memory speed (a 500 KiB Secret in ~0.5 ms without
// garbage, against ~8 ms and 1 MB of garbage typed). The cache is bounded
// by bytes (LRU) and keyed by a weak pointer to the *store.Object: stored
// objects are immutable and shared by snapshots, so a pointer identifies one
// state of one object, and the cache neither keeps objects alive nor
// outlives them (an entry is dropped when its object is garbage collected).
package encoding

import (
	"encoding/binary"
	"fmt"
	"io"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	sigsjson "sigs.k8s.io/json"

	"github.com/cachetier/cachetier/cache-server/internal/jsonproto"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// ProtobufMediaType is the apiserver's protobuf media type.
const ProtobufMediaType = "application/vnd.kubernetes.protobuf"

// magic starts every protobuf-encoded Kubernetes object.
var magic = []byte{0x6b, 0x38, 0x73, 0x00}

// DefaultCacheBytes bounds the protobuf cache when no size is configured.
const DefaultCacheBytes = 256 << 20

// LargeMessageBytes: messages of this size and more that the plan produced
// are converted on every use instead of cached.
const LargeMessageBytes = 64 << 10

// Conversion paths, as counted by Options.Conversions.
const (
	PathCached = "cached" // the message was in the cache
	PathPlan   = "plan"   // converted by the jsonproto plan
	PathTyped  = "typed"  // converted through the Go type (the plan refused the type or the JSON)
)

// Protobuf converts and caches. It is safe for concurrent use.
type Protobuf struct {
	decoder     runtime.Decoder
	plans       *jsonproto.Plans
	cache       *lru
	conversions func(path string)
}

// NewProtobuf returns a converter whose cache holds at most maxBytes of
// encoded objects (plus a fixed per-entry overhead); <= 0 disables caching.
// conversions, when not nil, is called once per message served with its
// path (PathCached, PathPlan, PathTyped).
func NewProtobuf(maxBytes int64, conversions func(path string)) *Protobuf {
	if conversions == nil {
		conversions = func(string) {}
	}
	return &Protobuf{
		decoder:     jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{}),
		plans:       jsonproto.NewPlans(),
		cache:       newLRU(maxBytes),
		conversions: conversions,
	}
}

// Supports reports whether objects of gvk have a protobuf encoding: the
// built-in types client-go knows. Custom resources never do.
func Supports(gvk schema.GroupVersionKind) bool {
	if !scheme.Scheme.Recognizes(gvk) {
		return false
	}
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return false
	}
	_, ok := obj.(marshaler)
	return ok
}

type marshaler interface {
	Marshal() ([]byte, error)
}

// Variants of an object's encoding kept in the cache.
const (
	variantObject   uint8 = iota // the typed object's message
	variantMetadata              // PartialObjectMetadata's message

	// variantSizeOnly marks an entry holding only the length of a large
	// message (a uvarint) that the plan converted once: proof that it is
	// streamed from the JSON safely (WriteMessage) instead of being cached.
	variantSizeOnly uint8 = 0x80
)

var partialObjectMetadataType = reflect.TypeFor[metav1.PartialObjectMetadata]()

// Object returns the protobuf message of o as a gvk (no envelope). The
// caller may keep it.
func (p *Protobuf) Object(gvk schema.GroupVersionKind, o *store.Object) ([]byte, error) {
	return p.message(gvk, o, variantObject)
}

// Metadata returns the protobuf message of o as a PartialObjectMetadata (no
// envelope). It works for any object, custom resources included, as the
// apiserver's metadata-only protobuf answers do.
func (p *Protobuf) Metadata(o *store.Object) ([]byte, error) {
	return p.message(schema.GroupVersionKind{}, o, variantMetadata)
}

// WriteMessage writes o's message (Object, or Metadata when metadataOnly)
// to w between the head and tail frame returns for its length: the way a
// watch event goes out. A small message is converted once and cached. A
// large one is streamed from the JSON in chunks (jsonproto's
// Conversion.Write): no buffer of its size per watcher, and no second copy
// of large objects held next to their JSON. Its first use also writes it
// into io.Discard, which proves the JSON converts before any byte reaches
// a client (a failure half-way would break the stream); the cache then
// keeps only its size, as that proof.
func (p *Protobuf) WriteMessage(w io.Writer, gvk schema.GroupVersionKind, o *store.Object, metadataOnly bool, frame func(msgLen int) (head, tail []byte)) error {
	return p.writeMessage(w, gvk, o, metadataOnly, frame, true)
}

// WriteListItem writes o's message as an item of a list body written from
// its pieces (ListHead): ListItemHead, then the message, streamed as
// WriteMessage streams it. scratch is a buffer for the item head, reused
// across items. It returns the message's length, which the caller checks
// against the one MessageLen gave: a body whose items do not add up to
// its declared length must not be completed. Cache hits are not counted:
// MessageLen counted the message served.
func (p *Protobuf) WriteListItem(w io.Writer, gvk schema.GroupVersionKind, o *store.Object, metadataOnly bool, f ListFormat, scratch *[]byte) (int, error) {
	n := -1
	err := p.writeMessage(w, gvk, o, metadataOnly, func(msgLen int) (head, tail []byte) {
		n = msgLen
		*scratch = ListItemHead((*scratch)[:0], msgLen, f)
		return *scratch, nil
	}, false)
	return n, err
}

func (p *Protobuf) writeMessage(w io.Writer, gvk schema.GroupVersionKind, o *store.Object, metadataOnly bool, frame func(msgLen int) (head, tail []byte), countCached bool) error {
	msg, cv, err := p.convertCounted(gvk, o, variantOf(metadataOnly), true, countCached)
	if err != nil {
		return err
	}
	if cv != nil {
		defer cv.Release()
		head, tail := frame(cv.Size())
		if _, err := w.Write(head); err != nil {
			return err
		}
		if err := cv.Write(w); err != nil {
			return err
		}
		_, err := w.Write(tail)
		return err
	}
	head, tail := frame(len(msg))
	for _, b := range [][]byte{head, msg, tail} {
		if len(b) == 0 {
			continue
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// variantOf is the cached message variant: the object or its metadata.
func variantOf(metadataOnly bool) uint8 {
	if metadataOnly {
		return variantMetadata
	}
	return variantObject
}

// MessageLen is the length of o's message (Object, or Metadata when
// metadataOnly), found in the cache or converted, without keeping it: a
// large message is only prepared (its size is known before it is built)
// and proved streamable, as WriteMessage would. A list written from its
// pieces (ListHead) asks each item's length first, then writes each with
// WriteMessage; see the front's writeProtobufList for why twice.
func (p *Protobuf) MessageLen(gvk schema.GroupVersionKind, o *store.Object, metadataOnly bool) (int, error) {
	msg, cv, err := p.convert(gvk, o, variantOf(metadataOnly), true)
	if err != nil {
		return 0, err
	}
	if cv != nil {
		defer cv.Release()
		return cv.Size(), nil
	}
	return len(msg), nil
}

// message converts (or finds) o's message; small ones are cached.
func (p *Protobuf) message(gvk schema.GroupVersionKind, o *store.Object, variant uint8) ([]byte, error) {
	msg, _, err := p.convert(gvk, o, variant, false)
	return msg, err
}

// convert finds or converts o's message. With stream, a large message the
// plan converts is not converted here but returned prepared (cv), for the
// caller to write and release; otherwise the message is returned (small
// ones cached), converted by the plan, or the typed way when the plan
// refuses the type or the JSON.
func (p *Protobuf) convert(gvk schema.GroupVersionKind, o *store.Object, variant uint8, stream bool) (msg []byte, cv *jsonproto.Conversion, err error) {
	return p.convertCounted(gvk, o, variant, stream, true)
}

// convertCounted is convert; a cache hit is counted only when countCached.
func (p *Protobuf) convertCounted(gvk schema.GroupVersionKind, o *store.Object, variant uint8, stream, countCached bool) (msg []byte, cv *jsonproto.Conversion, err error) {
	if b, ok := p.cache.get(o, variant); ok {
		if countCached {
			p.conversions(PathCached)
		}
		return b, nil, nil
	}
	rt, err := p.goType(gvk, variant)
	if err != nil {
		return nil, nil, err
	}
	if plan, perr := p.plans.For(rt); perr == nil {
		if cv, err := plan.Prepare(o.Raw); err == nil {
			if stream && cv.Size() >= LargeMessageBytes && p.provedStreamable(o, variant, cv) {
				p.conversions(PathPlan)
				return nil, cv, nil
			}
			out, err := cv.Append(make([]byte, 0, cv.Size()))
			cv.Release()
			if err == nil {
				p.conversions(PathPlan)
				if len(out) < LargeMessageBytes {
					p.cache.put(o, variant, out)
				}
				return out, nil, nil
			}
		}
	}
	// The plan refused the type or this JSON: the typed path decides (and
	// reports the error, if the JSON is not what the type accepts).
	b, err := p.typed(gvk, rt, o, variant)
	if err != nil {
		return nil, nil, err
	}
	p.conversions(PathTyped)
	p.cache.put(o, variant, b)
	return b, nil, nil
}

// provedStreamable reports whether cv, a large message of o, can be
// streamed: proved once (written into io.Discard, which decodes its
// base64) and remembered as its size in the cache.
func (p *Protobuf) provedStreamable(o *store.Object, variant uint8, cv *jsonproto.Conversion) bool {
	if sized, ok := p.cache.get(o, variant|variantSizeOnly); ok {
		n, k := binary.Uvarint(sized)
		return k > 0 && int(n) == cv.Size()
	}
	if cv.Write(io.Discard) != nil {
		return false
	}
	p.cache.put(o, variant|variantSizeOnly, binary.AppendUvarint(nil, uint64(cv.Size())))
	return true
}

// goType is the Go type a variant's message is generated from.
func (p *Protobuf) goType(gvk schema.GroupVersionKind, variant uint8) (reflect.Type, error) {
	if variant == variantMetadata {
		return partialObjectMetadataType, nil
	}
	rt, ok := scheme.Scheme.AllKnownTypes()[gvk]
	if !ok {
		return nil, fmt.Errorf("protobuf: %s has no Go type", gvk)
	}
	return rt, nil
}

func (p *Protobuf) typed(gvk schema.GroupVersionKind, rt reflect.Type, o *store.Object, variant uint8) ([]byte, error) {
	if variant == variantMetadata {
		var m metav1.PartialObjectMetadata
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(o.Raw, &m); err != nil {
			return nil, fmt.Errorf("protobuf: decode metadata of %s: %w", o.Key, err)
		}
		m.TypeMeta = metav1.TypeMeta{}
		return m.Marshal()
	}
	into, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("protobuf: %s: %w", gvk, err)
	}
	obj, _, err := p.decoder.Decode(o.Raw, nil, into)
	if err != nil {
		return nil, fmt.Errorf("protobuf: decode %s %s: %w", gvk.Kind, o.Key, err)
	}
	m, ok := obj.(marshaler)
	if !ok {
		return nil, fmt.Errorf("protobuf: %s has no protobuf encoding", gvk)
	}
	b, err := m.Marshal()
	if err != nil {
		return nil, fmt.Errorf("protobuf: encode %s %s: %w", gvk.Kind, o.Key, err)
	}
	return b, nil
}

// CacheStats reports the cache's entries and bytes.
func (p *Protobuf) CacheStats() (entries int, bytes int64) { return p.cache.stats() }

// Envelope wraps one message (an object, a list, a Status) as the apiserver
// sends it: magic + runtime.Unknown{TypeMeta{apiVersion, kind}, Raw: msg}.
func Envelope(apiVersion, kind string, msg []byte) []byte {
	tm := typeMeta(apiVersion, kind)
	out := make([]byte, 0, len(magic)+envelopeOverhead(len(tm), len(msg))+len(msg))
	out = append(out, magic...)
	out = appendUnknownHead(out, tm, len(msg))
	out = append(out, msg...)
	return appendUnknownTail(out)
}

// ListFormat is how a list message numbers its two fields. Every list
// type numbers its metadata 1 and its items 2, except meta.k8s.io/v1beta1's
// PartialObjectMetadataList (items 1, metadata 2); a message writes its
// fields in number order, so that one's metadata comes after its items.
type ListFormat int

const (
	// ListMetaFirst: metadata = 1, items = 2.
	ListMetaFirst ListFormat = iota
	// ListItemsFirst: items = 1, metadata = 2
	// (metav1beta1.PartialObjectMetadataList).
	ListItemsFirst
)

// List is the enveloped protobuf encoding of a list of kind listKind: meta
// and items are messages (ListMeta and one per item), as from Object or
// Metadata and metav1.ListMeta.Marshal. It is ListHead, each item's
// ListItemHead and message, and ListEnd: a list too large to build is
// written from those pieces (the front streams its LISTs that way).
func List(apiVersion, listKind string, meta []byte, items [][]byte, f ListFormat) []byte {
	itemsLen := 0
	for _, it := range items {
		itemsLen += ListItemLen(len(it))
	}
	head, end := ListHead(apiVersion, listKind, meta, itemsLen, f), ListEnd(meta, f)
	out := make([]byte, 0, len(head)+itemsLen+len(end))
	out = append(out, head...)
	for _, it := range items {
		out = ListItemHead(out, len(it), f)
		out = append(out, it...)
	}
	return append(out, end...)
}

// ListItemLen is what an item message of msgLen bytes takes in a list
// body: its field tag and length, then the message.
func ListItemLen(msgLen int) int { return 1 + uvarintLen(uint64(msgLen)) + msgLen }

// ListHead is a list body up to its first item: the magic, the envelope's
// TypeMeta, the header of its raw field and (ListMetaFirst) the list's
// metadata. itemsLen is the sum of ListItemLen over the items that follow:
// the envelope's raw field is length-prefixed, so the items' total must be
// known before the first byte is written.
func ListHead(apiVersion, listKind string, meta []byte, itemsLen int, f ListFormat) []byte {
	metaField := 1 + uvarintLen(uint64(len(meta))) + len(meta)
	body := metaField + itemsLen
	tm := typeMeta(apiVersion, listKind)
	out := make([]byte, 0, len(magic)+envelopeOverhead(len(tm), body)+metaField)
	out = append(out, magic...)
	out = appendUnknownHead(out, tm, body)
	if f == ListItemsFirst {
		return out
	}
	return appendListMeta(out, 0x0a, meta) // field 1, length-delimited
}

// ListItemHead appends what precedes an item message of msgLen bytes in a
// list body: the items field's tag (length-delimited) and the length.
func ListItemHead(dst []byte, msgLen int, f ListFormat) []byte {
	tag := byte(0x12) // field 2
	if f == ListItemsFirst {
		tag = 0x0a // field 1
	}
	dst = append(dst, tag)
	return binary.AppendUvarint(dst, uint64(msgLen))
}

// ListEnd ends a list body after its last item: (ListItemsFirst) the
// list's metadata, then the envelope's empty contentEncoding and
// contentType.
func ListEnd(meta []byte, f ListFormat) []byte {
	if f == ListItemsFirst {
		return append(appendListMeta(nil, 0x12, meta), unknownTail...) // field 2
	}
	return []byte(unknownTail)
}

func appendListMeta(dst []byte, tag byte, meta []byte) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(meta)))
	return append(dst, meta...)
}

// Status is a Status in the protobuf envelope, as the apiserver sends errors
// to protobuf clients.
func Status(st metav1.Status) []byte {
	st.TypeMeta = metav1.TypeMeta{}
	b, err := st.Marshal()
	if err != nil {
		// Status has no field that can fail to marshal.
		panic(err)
	}
	return Envelope("v1", "Status", b)
}

// WatchFrame is one event of a protobuf watch stream: a 4-byte big-endian
// length, then a metav1.WatchEvent{type, object: RawExtension{raw: object}}
// without envelope (the apiserver's stream serializer is the raw protobuf
// serializer); object is the enveloped object (Envelope).
func WatchFrame(eventType string, object []byte) []byte {
	var ev []byte
	ev = append(ev, 0x0a)
	ev = binary.AppendUvarint(ev, uint64(len(eventType)))
	ev = append(ev, eventType...)
	// RawExtension{raw = 1}
	rawExt := 1 + uvarintLen(uint64(len(object))) + len(object)
	ev = append(ev, 0x12)
	ev = binary.AppendUvarint(ev, uint64(rawExt))
	ev = append(ev, 0x0a)
	ev = binary.AppendUvarint(ev, uint64(len(object)))
	ev = append(ev, object...)
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(ev)), uint32(len(ev)))
	return append(out, ev...)
}

// WatchObjectFrame returns what a protobuf watch stream sends before and
// after msg for an event whose object is Envelope(apiVersion, kind, msg):
// head + msg + tail == WatchFrame(eventType, Envelope(apiVersion, kind,
// msg)). Writing the three parts sends the (cached) message as is; building
// the frame copied it twice per event and watcher — for 64 watch-lists of
// 500 KiB Secrets, ~1 MB of garbage per event per watcher, most of the
// tier's memory growth in hack/bench's watch-list scenario.
func WatchObjectFrame(eventType, apiVersion, kind string, msgLen int) (head, tail []byte) {
	tm := typeMeta(apiVersion, kind)
	envLen := len(magic) + envelopeOverhead(len(tm), msgLen) + msgLen
	rawExt := 1 + uvarintLen(uint64(envLen)) + envLen
	evLen := 1 + uvarintLen(uint64(len(eventType))) + len(eventType) + 1 + uvarintLen(uint64(rawExt)) + rawExt
	head = make([]byte, 0, 4+evLen-msgLen)
	head = binary.BigEndian.AppendUint32(head, uint32(evLen))
	head = append(head, 0x0a)
	head = binary.AppendUvarint(head, uint64(len(eventType)))
	head = append(head, eventType...)
	head = append(head, 0x12)
	head = binary.AppendUvarint(head, uint64(rawExt))
	head = append(head, 0x0a)
	head = binary.AppendUvarint(head, uint64(envLen))
	head = append(head, magic...)
	head = appendUnknownHead(head, tm, msgLen)
	return head, appendUnknownTail(nil)
}

// typeMeta is runtime.TypeMeta{apiVersion = 1, kind = 2} as a message.
func typeMeta(apiVersion, kind string) []byte {
	b := make([]byte, 0, 4+len(apiVersion)+len(kind))
	b = append(b, 0x0a)
	b = binary.AppendUvarint(b, uint64(len(apiVersion)))
	b = append(b, apiVersion...)
	b = append(b, 0x12)
	b = binary.AppendUvarint(b, uint64(len(kind)))
	return append(b, kind...)
}

// appendUnknownHead writes runtime.Unknown's typeMeta (1) and the header of
// raw (2); the caller appends rawLen bytes, then appendUnknownTail.
func appendUnknownHead(out, tm []byte, rawLen int) []byte {
	out = append(out, 0x0a)
	out = binary.AppendUvarint(out, uint64(len(tm)))
	out = append(out, tm...)
	out = append(out, 0x12)
	return binary.AppendUvarint(out, uint64(rawLen))
}

// appendUnknownTail writes the empty contentEncoding (3) and contentType (4)
// that runtime.Unknown always carries.
func appendUnknownTail(out []byte) []byte { return append(out, unknownTail...) }

// unknownTail ends a runtime.Unknown after its raw field: contentEncoding
// (3) and contentType (4), both empty.
const unknownTail = "\x1a\x00\x22\x00"

func envelopeOverhead(tmLen, rawLen int) int {
	return 1 + uvarintLen(uint64(tmLen)) + tmLen + 1 + uvarintLen(uint64(rawLen)) + 4
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

package front

import (
	"bytes"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	encoding_ "github.com/cachetier/cachetier/cache-server/internal/encoding"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// The LIST bodies built whole in memory, as the front built them before
// writeList streamed every form: the reference the streamed bodies must
// equal byte for byte (and what the benchmarks compare against).

// encodeList is a whole LIST body in enc (not Table). Items are the stored bytes (JSON)
// or the cached per-object protobuf messages: nothing is re-encoded when the
// cache is warm.
func encodeList(res *resource, enc encoding, meta metav1.ListMeta, items []*store.Object) ([]byte, error) {
	switch enc {
	case encTable:
		return nil, errTableEncoding
	case encProtobuf, encProtobufPartialMetadata, encProtobufPartialMetadataV1beta1:
		mb, err := meta.Marshal()
		if err != nil {
			return nil, err
		}
		msgs := make([][]byte, len(items))
		gvk := res.GVR.GroupVersion().WithKind(res.APIResource.Kind)
		for i, o := range items {
			if enc == encProtobuf {
				msgs[i], err = res.protobuf.Object(gvk, o)
			} else {
				msgs[i], err = res.protobuf.Metadata(o)
			}
			if err != nil {
				return nil, err
			}
		}
		if enc.isPartialMetadata() {
			return encoding_.List(enc.metaAPIVersion(), "PartialObjectMetadataList", mb, msgs, enc.listFormat()), nil
		}
		return encoding_.List(res.GVR.GroupVersion().String(), res.APIResource.Kind+"List", mb, msgs, encoding_.ListMetaFirst), nil
	}
	kind, apiVersion := res.APIResource.Kind+"List", res.GVR.GroupVersion().String()
	if enc.isPartialMetadata() {
		kind, apiVersion = "PartialObjectMetadataList", enc.metaAPIVersion()
	}
	head, err := jsonListHead(kind, apiVersion, meta)
	if err != nil {
		return nil, err
	}
	if enc == encJSON {
		buf := bytes.NewBuffer(make([]byte, 0, jsonListLen(res, head, items)))
		writeJSONList(buf, res, head, items)
		return buf.Bytes(), nil
	}
	if len(items) == 0 {
		// The apiserver's empty PartialObjectMetadataList: its Items are
		// appended to a nil slice (asPartialObjectMetadataList), "null".
		return marshalLine(&metav1.PartialObjectMetadataList{
			TypeMeta: metav1.TypeMeta{Kind: kind, APIVersion: apiVersion}, ListMeta: meta})
	}
	buf := bytes.NewBuffer(make([]byte, 0, len(head)+len(jsonListTail)+len(items)*256))
	buf.Write(head)
	for i, o := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		md, err := partialMetadata(o, apiVersion, res.Entry.Custom)
		if err != nil {
			return nil, err
		}
		buf.Write(md)
	}
	buf.WriteString(jsonListTail)
	return buf.Bytes(), nil
}

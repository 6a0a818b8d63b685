// Package tables turns stored objects into the metav1.Table kube-apiserver
// 1.37 answers for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
// (what kubectl get prints). It has one job and builds the table the way
// the apiserver does, with the apiserver's own code wherever it exists:
//
//   - built-in resources: the stored v1 JSON converted to the internal
//     type through a scheme built here from the upstream install packages,
//     printed by k8s.io/kubernetes/pkg/printers/internalversion (the same
//     handlers every registry's TableConvertor uses), or the generic
//     Name/Created At convertor for the registries that have no printer;
//   - custom resources: apiextensions-apiserver's tableconvertor with the
//     CRD's additionalPrinterColumns of the served version (Age when it has
//     none), kept current by watching the CRD (see Custom);
//   - the row objects (includeObject None/Metadata/Object) as the
//     apiserver's handlers set them after conversion (asTable).
//
// Parity comes by construction rather than by per-type code; the e2e
// tests in cache-server/e2e/kubectl compare kubectl's output with the
// apiserver's.
package tables

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1beta1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/rest"
)

// Printer builds the Table of one resource from stored JSON objects (each
// with its kind and apiVersion, as the tier stores them).
type Printer interface {
	// Table is the Table of items: one object (a GET, a watch event) when
	// list is false, otherwise a list with meta (LIST).
	Table(items [][]byte, list bool, meta metav1.ListMeta, opts Options) (*metav1.Table, error)
}

// Options is how the client asked for the Table.
type Options struct {
	metav1.TableOptions
	// GroupVersion is the Table's group version (meta.k8s.io/v1 or
	// v1beta1): the apiVersion of PartialObjectMetadata row objects.
	GroupVersion schema.GroupVersion
}

// ParseOptions reads the Table options of a request's query as the
// apiserver does (optionsForTransform): includeObject must be empty,
// None, Metadata or Object.
func ParseOptions(q url.Values) (metav1.TableOptions, error) {
	var opts metav1.TableOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(q, metav1.SchemeGroupVersion, &opts); err != nil {
		return opts, err
	}
	switch errs := validation.ValidateTableOptions(&opts); len(errs) {
	case 0:
		return opts, nil
	case 1:
		return opts, apierrors.NewBadRequest(fmt.Sprintf("Unable to convert to Table as requested: %v", errs[0].Error()))
	default:
		return opts, apierrors.NewBadRequest(fmt.Sprintf("Unable to convert to Table as requested: %v", errs))
	}
}

// ConversionError is a stored object the Printer could not turn into a
// Table row (undecodable, or refused by the printer). It answers as an
// Internal Error Status, which is also what the apiserver answers when
// its printer fails.
type ConversionError struct {
	Resource schema.GroupResource
	Err      error
}

func (e *ConversionError) Error() string {
	return fmt.Sprintf("cannot build the Table of %s: %v", e.Resource, e.Err)
}

func (e *ConversionError) Unwrap() error { return e.Err }

// Status is the error's API Status.
func (e *ConversionError) Status() metav1.Status {
	return apierrors.NewInternalError(e).Status()
}

// convertor is what the apiserver's registries implement.
type convertor = rest.TableConvertor

// finish is the apiserver's asTable after ConvertToTable: each row's
// object becomes nothing, the object's metadata (PartialObjectMetadata in
// the Table's group version) or the whole object in the requested version.
// For the whole object the stored bytes are used: they are the apiserver's
// encoding of that object in that version. raw maps a row's object to its
// stored bytes.
func finish(t *metav1.Table, opts Options, raw func(runtime.Object) []byte) error {
	for i := range t.Rows {
		row := &t.Rows[i]
		obj := row.Object.Object
		row.Object = runtime.RawExtension{}
		if obj == nil {
			continue
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return apierrors.NewInternalError(err)
		}
		initialEnd := m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"
		switch {
		case opts.IncludeObject == metav1.IncludeObject && !initialEnd:
			b := raw(obj)
			if b == nil {
				return apierrors.NewInternalError(fmt.Errorf("no stored object for row %d", i))
			}
			row.Object.Raw = bytes.TrimRight(b, "\n")
		case opts.IncludeObject == metav1.IncludeMetadata, opts.IncludeObject == "", initialEnd:
			partial := meta.AsPartialObjectMetadata(m)
			partial.GetObjectKind().SetGroupVersionKind(opts.GroupVersion.WithKind("PartialObjectMetadata"))
			b, err := json.Marshal(partial)
			if err != nil {
				return apierrors.NewInternalError(err)
			}
			row.Object.Raw = b
		case opts.IncludeObject == metav1.IncludeNone:
		default:
			return apierrors.NewBadRequest(fmt.Sprintf("unrecognized includeObject value: %q", opts.IncludeObject))
		}
	}
	return nil
}

// convert runs c on obj and finishes the rows; objs maps the objects
// handed to c to their stored bytes.
func convert(c convertor, obj runtime.Object, objs map[runtime.Object][]byte, opts Options) (*metav1.Table, error) {
	t, err := c.ConvertToTable(context.Background(), obj, &opts.TableOptions)
	if err != nil {
		return nil, err
	}
	if err := finish(t, opts, func(o runtime.Object) []byte { return objs[o] }); err != nil {
		return nil, err
	}
	if t.Rows == nil {
		t.Rows = []metav1.TableRow{}
	}
	t.TypeMeta = metav1.TypeMeta{Kind: "Table", APIVersion: opts.GroupVersion.String()}
	return t, nil
}

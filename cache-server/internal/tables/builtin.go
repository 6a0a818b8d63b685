package tables

import (
	"bytes"
	"fmt"

	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	crdtable "k8s.io/apiextensions-apiserver/pkg/registry/customresourcedefinition/tableconvertor"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/rest"
	apiregistrationinstall "k8s.io/kube-aggregator/pkg/apis/apiregistration/install"
	apiserviceregistry "k8s.io/kube-aggregator/pkg/registry/apiservice/etcd"
	admissionregistrationinstall "k8s.io/kubernetes/pkg/apis/admissionregistration/install"
	apiserverinternalinstall "k8s.io/kubernetes/pkg/apis/apiserverinternal/install"
	appsinstall "k8s.io/kubernetes/pkg/apis/apps/install"
	autoscalinginstall "k8s.io/kubernetes/pkg/apis/autoscaling/install"
	batchinstall "k8s.io/kubernetes/pkg/apis/batch/install"
	certificatesinstall "k8s.io/kubernetes/pkg/apis/certificates/install"
	coordinationinstall "k8s.io/kubernetes/pkg/apis/coordination/install"
	coreinstall "k8s.io/kubernetes/pkg/apis/core/install"
	discoveryinstall "k8s.io/kubernetes/pkg/apis/discovery/install"
	eventsinstall "k8s.io/kubernetes/pkg/apis/events/install"
	flowcontrolinstall "k8s.io/kubernetes/pkg/apis/flowcontrol/install"
	lifecycleinstall "k8s.io/kubernetes/pkg/apis/lifecycle/install"
	networkinginstall "k8s.io/kubernetes/pkg/apis/networking/install"
	nodeinstall "k8s.io/kubernetes/pkg/apis/node/install"
	policyinstall "k8s.io/kubernetes/pkg/apis/policy/install"
	rbacinstall "k8s.io/kubernetes/pkg/apis/rbac/install"
	resourceinstall "k8s.io/kubernetes/pkg/apis/resource/install"
	schedulinginstall "k8s.io/kubernetes/pkg/apis/scheduling/install"
	storageinstall "k8s.io/kubernetes/pkg/apis/storage/install"
	storagemigrationinstall "k8s.io/kubernetes/pkg/apis/storagemigration/install"
	"k8s.io/kubernetes/pkg/printers"
	printersinternal "k8s.io/kubernetes/pkg/printers/internalversion"
	printerstorage "k8s.io/kubernetes/pkg/printers/storage"
	sigsjson "sigs.k8s.io/json"
)

// noPrinter are the built-in resources whose registry (kubernetes
// pkg/registry/.../storage.go, 1.37.1) uses rest.NewDefaultTableConvertor
// instead of the printers: their Tables are Name and Created At.
var noPrinter = map[schema.GroupResource]bool{
	{Group: "", Resource: "limitranges"}:                           true,
	{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}: true,
	{Group: "rbac.authorization.k8s.io", Resource: "roles"}:        true,
	{Group: "storage.k8s.io", Resource: "csistoragecapacities"}:    true,
}

// Builtins prints built-in resources. It holds its own scheme (the
// upstream install functions applied to a fresh runtime.Scheme) and one
// table generator with the apiserver's print handlers; both are read-only
// after NewBuiltins and safe for concurrent use.
type Builtins struct {
	scheme    *runtime.Scheme
	generator *printers.HumanReadableGenerator
}

// NewBuiltins builds the scheme and the print handlers.
func NewBuiltins() *Builtins {
	s := runtime.NewScheme()
	for _, install := range []func(*runtime.Scheme){
		admissionregistrationinstall.Install, apiserverinternalinstall.Install, appsinstall.Install,
		autoscalinginstall.Install, batchinstall.Install, certificatesinstall.Install, coordinationinstall.Install,
		coreinstall.Install, discoveryinstall.Install, eventsinstall.Install, flowcontrolinstall.Install,
		lifecycleinstall.Install, networkinginstall.Install, nodeinstall.Install, policyinstall.Install,
		rbacinstall.Install, resourceinstall.Install, schedulinginstall.Install, storageinstall.Install,
		storagemigrationinstall.Install, apiextensionsinstall.Install, apiregistrationinstall.Install,
	} {
		install(s)
	}
	return &Builtins{
		scheme:    s,
		generator: printers.NewTableGenerator().With(printersinternal.AddHandlers),
	}
}

// For is the Printer of a built-in resource: the printers when the
// apiserver's registry uses them and the scheme knows the kind, otherwise
// the default convertor over the objects' metadata.
func (b *Builtins) For(gvr schema.GroupVersionResource, kind string) Printer {
	gr := gvr.GroupResource()
	external := gvr.GroupVersion().WithKind(kind)
	internal := schema.GroupVersion{Group: gvr.Group, Version: runtime.APIVersionInternal}
	if noPrinter[gr] || !b.scheme.Recognizes(external) || !b.scheme.Recognizes(internal.WithKind(kind)) || !b.scheme.Recognizes(internal.WithKind(kind+"List")) {
		return Default(gr)
	}
	var c convertor = printerstorage.TableConvertor{TableGenerator: b.generator}
	if gr == (schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}) {
		// apiextensions-apiserver's own convertor, not a printer.
		c = crdtable.New()
	}
	if gr == (schema.GroupResource{Group: "apiregistration.k8s.io", Resource: "apiservices"}) {
		// kube-aggregator's own convertor (Service, Available), a method
		// of its registry that reads nothing but the object.
		c = &apiserviceregistry.REST{}
	}
	return &builtin{b: b, gr: gr, external: external, internal: internal.WithKind(kind), c: c}
}

type builtin struct {
	b                  *Builtins
	gr                 schema.GroupResource
	external, internal schema.GroupVersionKind
	c                  convertor
}

func (p *builtin) Table(items [][]byte, list bool, lm metav1.ListMeta, opts Options) (*metav1.Table, error) {
	objs := make(map[runtime.Object][]byte, len(items))
	decoded := make([]runtime.Object, len(items))
	for i, raw := range items {
		o, err := p.decode(raw)
		if err != nil {
			return nil, &ConversionError{Resource: p.gr, Err: err}
		}
		decoded[i] = o
		if !list {
			objs[o] = raw
		}
	}
	var obj runtime.Object
	if list {
		l, err := p.b.scheme.New(p.internal.GroupVersion().WithKind(p.internal.Kind + "List"))
		if err != nil {
			return nil, &ConversionError{Resource: p.gr, Err: err}
		}
		if err := meta.SetList(l, decoded); err != nil {
			return nil, &ConversionError{Resource: p.gr, Err: err}
		}
		la, err := meta.ListAccessor(l)
		if err != nil {
			return nil, &ConversionError{Resource: p.gr, Err: err}
		}
		la.SetResourceVersion(lm.ResourceVersion)
		la.SetContinue(lm.Continue)
		la.SetRemainingItemCount(lm.RemainingItemCount)
		// SetList copied the items into the list: the printer's rows
		// point at the copies.
		i := 0
		_ = meta.EachListItem(l, func(o runtime.Object) error {
			objs[o] = items[i]
			i++
			return nil
		})
		obj = l
	} else {
		if len(decoded) != 1 {
			return nil, &ConversionError{Resource: p.gr, Err: fmt.Errorf("%d objects for a single-object Table", len(decoded))}
		}
		obj = decoded[0]
	}
	t, err := convertSafely(p.gr, p.c, obj, objs, opts)
	return t, err
}

// decode is one stored object as its internal type. No defaulting: the
// stored JSON is the apiserver's output, already defaulted, and a bookmark
// must print as the bare object the apiserver prints for it.
func (p *builtin) decode(raw []byte) (runtime.Object, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		// The decoder takes "" and null for an empty object.
		return nil, fmt.Errorf("stored object is not a JSON object")
	}
	ext, err := p.b.scheme.New(p.external)
	if err != nil {
		return nil, err
	}
	// The apiserver's JSON decoding (case-sensitive, integers kept) straight
	// into the typed object: the serializer's decoder would parse the
	// bytes twice (once to find the kind), a quarter of a row's cost.
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, ext); err != nil {
		return nil, err
	}
	if gvk := ext.GetObjectKind().GroupVersionKind(); gvk != p.external {
		return nil, fmt.Errorf("stored object is a %s, not a %s", gvk, p.external)
	}
	out := ext
	in, err := p.b.scheme.New(p.internal)
	if err != nil {
		return nil, err
	}
	if err := p.b.scheme.Convert(out, in, nil); err != nil {
		return nil, err
	}
	return in, nil
}

// Default is the Printer of a resource whose registry has no printer:
// the apiserver's default convertor (Name, Created At).
func Default(gr schema.GroupResource) Printer {
	return &generic{gr: gr, c: rest.NewDefaultTableConvertor(gr)}
}

// generic prints objects decoded as unstructured: the default convertor
// and the custom resource convertor read them through accessors and
// JSONPath, as the apiserver's do.
type generic struct {
	gr schema.GroupResource
	c  convertor
}

func (p *generic) Table(items [][]byte, list bool, lm metav1.ListMeta, opts Options) (*metav1.Table, error) {
	return unstructuredTable(p.gr, p.c, items, list, lm, opts)
}

func unstructuredTable(gr schema.GroupResource, c convertor, items [][]byte, list bool, lm metav1.ListMeta, opts Options) (*metav1.Table, error) {
	objs := make(map[runtime.Object][]byte, len(items))
	ul := &unstructured.UnstructuredList{Object: map[string]any{}, Items: make([]unstructured.Unstructured, len(items))}
	for i, raw := range items {
		if err := ul.Items[i].UnmarshalJSON(raw); err != nil {
			return nil, &ConversionError{Resource: gr, Err: err}
		}
		objs[&ul.Items[i]] = raw
	}
	var obj runtime.Object = ul
	if list {
		ul.SetResourceVersion(lm.ResourceVersion)
		ul.SetContinue(lm.Continue)
		ul.SetRemainingItemCount(lm.RemainingItemCount)
	} else {
		if len(items) != 1 {
			return nil, &ConversionError{Resource: gr, Err: fmt.Errorf("%d objects for a single-object Table", len(items))}
		}
		obj = &ul.Items[0]
	}
	return convertSafely(gr, c, obj, objs, opts)
}

// convertSafely is convert with a printer's panic turned into a
// ConversionError: a printer meeting data it does not expect must fail the
// request, not the process.
func convertSafely(gr schema.GroupResource, c convertor, obj runtime.Object, objs map[runtime.Object][]byte, opts Options) (t *metav1.Table, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, &ConversionError{Resource: gr, Err: fmt.Errorf("printer panicked: %v", r)}
		}
	}()
	t, err = convert(c, obj, objs, opts)
	return t, err
}

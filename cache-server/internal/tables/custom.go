package tables

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Custom prints one served version of a custom resource with its CRD's
// additionalPrinterColumns, as apiextensions-apiserver's crdHandler does.
// The columns follow the CRD: Update swaps the convertor atomically, so a
// request uses one consistent set of columns.
type Custom struct {
	gr      schema.GroupResource
	version string
	c       atomic.Pointer[convertor]
}

// NewCustom is the Printer of version of the custom resource gr, with
// the columns of crd (nil: the default Age column until Update).
func NewCustom(gr schema.GroupResource, version string, crd *apiextensionsv1.CustomResourceDefinition) *Custom {
	c := &Custom{gr: gr, version: version}
	c.Update(crd)
	return c
}

// Update takes the columns of the CRD's version. Like the crdHandler, a
// column whose JSONPath does not parse ends the column list there (the
// handler serves the partial convertor tableconvertor.New returns).
func (c *Custom) Update(crd *apiextensionsv1.CustomResourceDefinition) {
	conv, _ := tableconvertor.New(CustomColumns(crd, c.version))
	c.c.Store(&conv)
}

// CustomColumns are the printer columns the apiserver uses for version of
// crd: its additionalPrinterColumns, or Age when it has none
// (apiextensions-apiserver's serveDefaultColumnsIfEmpty).
func CustomColumns(crd *apiextensionsv1.CustomResourceDefinition, version string) []apiextensionsv1.CustomResourceColumnDefinition {
	if crd != nil {
		for _, v := range crd.Spec.Versions {
			if v.Name == version && len(v.AdditionalPrinterColumns) > 0 {
				return v.AdditionalPrinterColumns
			}
		}
	}
	return []apiextensionsv1.CustomResourceColumnDefinition{
		{Name: "Age", Type: "date", Description: metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"], JSONPath: ".metadata.creationTimestamp"},
	}
}

func (c *Custom) Table(items [][]byte, list bool, lm metav1.ListMeta, opts Options) (*metav1.Table, error) {
	return unstructuredTable(c.gr, *c.c.Load(), items, list, lm, opts)
}

// Watch keeps c's columns current with the CRD named crdName until ctx
// ends (an informer on that one CRD: list and watch with a metadata.name
// field selector). A CRD that is deleted keeps the last columns: the
// resource stops being served anyway.
func (c *Custom) Watch(ctx context.Context, client apiextensionsclient.Interface, crdName string, log logr.Logger) {
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	sel := fields.OneTermEqualSelector("metadata.name", crdName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return crds.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return crds.Watch(ctx, o)
		},
	}
	update := func(obj any) {
		crd, ok := obj.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return
		}
		c.Update(crd)
		log.V(1).Info("custom resource printer columns updated", "resource", c.gr.String(), "version", c.version,
			"columns", len(CustomColumns(crd, c.version)), "generation", crd.Generation)
	}
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &apiextensionsv1.CustomResourceDefinition{},
		ResyncPeriod:  10 * time.Minute,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    update,
			UpdateFunc: func(_, obj any) { update(obj) },
		},
	})
	inf.RunWithContext(ctx)
}

// String names the printer in logs.
func (c *Custom) String() string { return fmt.Sprintf("%s/%s", c.gr, c.version) }

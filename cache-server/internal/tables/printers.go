package tables

import (
	"context"

	"github.com/go-logr/logr"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

	"github.com/cachetier/cachetier/cache-server/internal/catalog"
)

// ForEntries is the Printer of each resolved resource, in order. The
// printers of custom resources follow their CRD (Custom.Watch) until ctx
// ends; client reads the CRDs (nil: the columns stay as Resolve read them).
func ForEntries(ctx context.Context, client apiextensionsclient.Interface, entries []catalog.Entry, log logr.Logger) []Printer {
	b := NewBuiltins()
	out := make([]Printer, len(entries))
	for i, e := range entries {
		gvr := e.Resource.GVR
		if !e.Custom {
			out[i] = b.For(gvr, e.Resource.Kind)
			continue
		}
		c := NewCustom(gvr.GroupResource(), gvr.Version, e.CRD)
		if client != nil {
			go c.Watch(ctx, client, gvr.Resource+"."+gvr.Group, log)
		}
		out[i] = c
	}
	return out
}

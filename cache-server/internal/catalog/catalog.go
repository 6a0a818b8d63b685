// Package catalog resolves a CacheProfile's resources against the
// apiserver's discovery: which exist, their kind and scope, whether they are
// custom resources (and their selectable fields), and the APIResource
// entries the tier's own discovery documents advertise.
package catalog

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/fields"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
)

// Entry is one cached resource, resolved.
type Entry struct {
	Resource upstream.Resource
	// APIResource is the apiserver's discovery entry with the verbs
	// narrowed to the ones the tier serves: get, list, watch.
	APIResource metav1.APIResource
	Custom      bool
	// CRD is a custom resource's definition as Resolve read it (nil for
	// built-in resources): its printer columns start the resource's
	// Table printer, which then follows the CRD (package tables).
	CRD    *apiextensionsv1.CustomResourceDefinition
	Fields *fields.Resource
	// FieldIndexes are the fields the tier indexes for the resource: the
	// profile's fieldIndexes, then those kube-apiserver's watch cache
	// indexes (Fields.APIServerIndexes) that the profile did not list.
	// Each is a field selectors can use (Fields.CheckIndex).
	FieldIndexes []string
	// NamespaceSelector restricts a namespaced resource to the namespaces
	// whose labels match (nil: every namespace).
	NamespaceSelector labels.Selector
}

// Resolve checks every resource of spec against the apiserver. An unknown
// resource is an error naming it: a profile that silently caches nothing
// for a typo would serve 404s that look like an apiserver problem.
func Resolve(ctx context.Context, cfg *rest.Config, spec v1alpha1.CacheProfileSpec) ([]Entry, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ext, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	byGV := map[string]*metav1.APIResourceList{}
	var out []Entry
	seen := map[schema.GroupVersionResource]bool{}
	for _, r := range spec.Resources {
		gvr := schema.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
		if seen[gvr] {
			return nil, fmt.Errorf("resource %s listed twice in the profile", describe(gvr))
		}
		seen[gvr] = true
		gv := gvr.GroupVersion().String()
		list, ok := byGV[gv]
		if !ok {
			list, err = dc.ServerResourcesForGroupVersion(gv)
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("resource %s: the apiserver does not serve group/version %q", describe(gvr), gv)
			}
			if err != nil {
				return nil, fmt.Errorf("discover %s: %w", gv, err)
			}
			byGV[gv] = list
		}
		var found *metav1.APIResource
		for i := range list.APIResources {
			if list.APIResources[i].Name == r.Resource {
				found = &list.APIResources[i]
				break
			}
		}
		if found == nil || strings.Contains(r.Resource, "/") {
			return nil, fmt.Errorf("resource %s is not served by the apiserver (known in %s: %s)", describe(gvr), gv, names(list))
		}
		if !hasVerbs(found.Verbs, "list", "watch") {
			return nil, fmt.Errorf("resource %s cannot be cached: the apiserver does not allow list and watch on it", describe(gvr))
		}
		e := Entry{
			Resource: upstream.Resource{GVR: gvr, Kind: found.Kind, Namespaced: found.Namespaced},
			APIResource: metav1.APIResource{
				Name: found.Name, SingularName: found.SingularName, Namespaced: found.Namespaced,
				Kind: found.Kind, Verbs: metav1.Verbs{"get", "list", "watch"}, ShortNames: found.ShortNames, Categories: found.Categories,
			},
		}
		if r.LabelSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(r.LabelSelector)
			if err != nil {
				return nil, fmt.Errorf("resource %s: invalid labelSelector: %w", describe(gvr), err)
			}
			// Not sel != labels.Everything(): comparing two selectors as
			// interfaces panics (their dynamic type is a slice).
			if !sel.Empty() {
				e.Resource.LabelSelector = sel.String()
			}
		}
		if r.NamespaceSelector != nil {
			if !found.Namespaced {
				return nil, fmt.Errorf("resource %s: namespaceSelector is only valid for namespaced resources", describe(gvr))
			}
			sel, err := metav1.LabelSelectorAsSelector(r.NamespaceSelector)
			if err != nil {
				return nil, fmt.Errorf("resource %s: invalid namespaceSelector: %w", describe(gvr), err)
			}
			if !sel.Empty() {
				e.NamespaceSelector = sel
			}
		}
		var selectable []string
		if r.Group != "" {
			crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, r.Resource+"."+r.Group, metav1.GetOptions{})
			switch {
			case err == nil:
				e.Custom = true
				e.CRD = crd
				for _, v := range crd.Spec.Versions {
					if v.Name == r.Version {
						for _, f := range v.SelectableFields {
							selectable = append(selectable, f.JSONPath)
						}
					}
				}
			case apierrors.IsNotFound(err):
			default:
				return nil, fmt.Errorf("resource %s: read its CustomResourceDefinition: %w", describe(gvr), err)
			}
		}
		if e.Fields, err = fields.New(fields.Spec{GVR: gvr, Kind: found.Kind, Namespaced: found.Namespaced, Custom: e.Custom, SelectableFields: selectable}); err != nil {
			return nil, fmt.Errorf("resource %s: %w", describe(gvr), err)
		}
		if e.FieldIndexes, err = fieldIndexes(r.FieldIndexes, e.Fields); err != nil {
			return nil, fmt.Errorf("resource %s: %w", describe(gvr), err)
		}
		out = append(out, e)
	}
	return out, nil
}

// fieldIndexes is Entry.FieldIndexes: the profile's, checked, then the
// apiserver's own.
func fieldIndexes(profile []string, f *fields.Resource) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, name := range profile {
		if err := f.CheckIndex(name); err != nil {
			return nil, fmt.Errorf("fieldIndexes: %w", err)
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	for _, name := range f.APIServerIndexes() {
		if !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	return out, nil
}

func describe(gvr schema.GroupVersionResource) string {
	if gvr.Group == "" {
		return fmt.Sprintf("%q (core/%s)", gvr.Resource, gvr.Version)
	}
	return fmt.Sprintf("%q (%s/%s)", gvr.Resource, gvr.Group, gvr.Version)
}

func names(l *metav1.APIResourceList) string {
	var n []string
	for _, r := range l.APIResources {
		if !strings.Contains(r.Name, "/") {
			n = append(n, r.Name)
		}
	}
	sort.Strings(n)
	return strings.Join(n, ", ")
}

func hasVerbs(have metav1.Verbs, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Package v1alpha1 holds the CacheProfile API: the single source of truth for
// what the cache tier caches and how it is run. The operator reconciles it into
// a fleet; the cache-server reads the same spec (rendered into its ConfigMap,
// or a file in standalone mode).
//
// +kubebuilder:object:generate=true
// +groupName=cachetier.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the CacheProfile API.
	GroupVersion = schema.GroupVersion{Group: "cachetier.io", Version: "v1alpha1"}

	// SchemeBuilder registers the API types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

func testScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNeedsApply(t *testing.T) {
	s := testScheme(t)
	p := testProfile()
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{ServiceMonitor: true, PrometheusRule: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range d.Objects() {
		want, err := toApplyObject(s, obj)
		if err != nil {
			t.Fatal(err)
		}
		if want.GetAnnotations()[AnnotationDesiredHash] == "" || want.GetAPIVersion() == "" || want.GetKind() == "" {
			t.Fatalf("%s: apply object lacks hash or type", obj.GetName())
		}
		if _, ok := want.Object["status"]; ok {
			t.Errorf("%s: status must not be applied", obj.GetName())
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(want.Object, "metadata", "creationTimestamp"); found {
			t.Errorf("%s: null creationTimestamp kept", obj.GetName())
		}
		if need, _ := NeedsApply(want, nil); !need {
			t.Errorf("%s: missing object not applied", obj.GetName())
		}
		// What the apiserver returns: our fields plus defaults and metadata.
		observed := want.DeepCopy()
		observed.SetResourceVersion("42")
		observed.SetUID("u")
		unstructured.SetNestedField(observed.Object, "defaulted", "spec", "someDefault")
		if need, why := NeedsApply(want, observed); need {
			t.Errorf("%s: unchanged object re-applied: %s", obj.GetName(), why)
		}
	}

	// Drift of an owned field is repaired.
	want, _ := toApplyObject(s, d.Shards[0])
	drifted := want.DeepCopy()
	unstructured.SetNestedField(drifted.Object, int64(7), "spec", "replicas")
	if need, why := NeedsApply(want, drifted); !need || why != "drifted at .spec.replicas" {
		t.Errorf("drift: %v %q", need, why)
	}
	// int64 vs float64 of the same number is not drift.
	asFloat := want.DeepCopy()
	unstructured.SetNestedField(asFloat.Object, float64(2), "spec", "replicas")
	if need, why := NeedsApply(want, asFloat); need {
		t.Errorf("numeric representation treated as drift: %s", why)
	}
	// A field the operator stops setting changes the hash: re-applied
	// (server-side apply then removes it).
	p2 := testProfile()
	p2.Spec.Scheduling.NodeSelector = map[string]string{"pool": "cache"}
	d2, _ := BuildDesired(p2, testOpts, testCerts(t, p2), Monitoring{ServiceMonitor: true, PrometheusRule: true})
	withSel, _ := toApplyObject(s, d2.Shards[0])
	if need, why := NeedsApply(want, withSel); !need || why != "desired state changed" {
		t.Errorf("removed field: %v %q", need, why)
	}
}

// Package sampledata creates the data set that tests and `make run` put in
// a local control plane: namespaces with labels, configmaps, secrets of two
// types, pods bound to nodes, events, and a CRD (widgets, with a selectable
// field and printer columns) with instances — enough to exercise every selector and scope the
// tier serves.
package sampledata

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Sizes says how many objects of each kind to create per namespace.
type Sizes struct {
	Namespaces, ConfigMaps, Secrets, Pods, Events, Widgets int
}

// Default is the data set of the tests: 1,000 configmaps in all, so a
// kubectl --chunk-size=50 run pages twenty times.
func Default() Sizes {
	return Sizes{Namespaces: 4, ConfigMaps: 250, Secrets: 10, Pods: 8, Events: 5, Widgets: 6}
}

// WidgetsGVR is the sample custom resource.
func WidgetsGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "example.cachetier.io", Version: "v1", Resource: "widgets"}
}

// Namespace is the name of the i-th sample namespace.
func Namespace(i int) string { return fmt.Sprintf("ns-%d", i) }

// Seed creates the data set: the widgets CRD (with selectableFields
// .spec.color, printer columns Color, Size (-o wide) and Age) and instances, and built-in objects whose labels and field
// values the selector cases exercise. cfg should allow a high QPS.
func Seed(ctx context.Context, cfg *rest.Config, sz Sizes) error {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := createWidgetCRD(ctx, apiextensionsclient.NewForConfigOrDie(cfg)); err != nil {
		return err
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	apps := []string{"a", "b", "c"}
	for i := 0; i < sz.Namespaces; i++ {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace(i), Labels: map[string]string{"team": apps[i%3]}}}
		if _, err := kc.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 0; i < sz.Namespaces; i++ {
		ns := Namespace(i)
		for j := 0; j < sz.ConfigMaps; j++ {
			g.Go(func() error {
				labels := map[string]string{"app": apps[j%3]}
				if j%2 == 0 {
					labels["tier"] = "x"
				}
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", j), Namespace: ns, Labels: labels},
					Data: map[string]string{"index": fmt.Sprint(j)}}
				_, err := kc.CoreV1().ConfigMaps(ns).Create(gctx, cm, metav1.CreateOptions{})
				return err
			})
		}
		for j := 0; j < sz.Secrets; j++ {
			g.Go(func() error {
				typ := corev1.SecretTypeOpaque
				if j%3 == 0 {
					typ = "example.com/custom"
				}
				s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%02d", j), Namespace: ns, Labels: map[string]string{"app": apps[j%3]}},
					Type: typ, StringData: map[string]string{"k": "v"}}
				_, err := kc.CoreV1().Secrets(ns).Create(gctx, s, metav1.CreateOptions{})
				return err
			})
		}
		for j := 0; j < sz.Pods; j++ {
			g.Go(func() error {
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%02d", j), Namespace: ns, Labels: map[string]string{"app": apps[j%3]}},
					Spec: corev1.PodSpec{
						NodeName:   fmt.Sprintf("node-%d", j%3),
						Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
					},
				}
				_, err := kc.CoreV1().Pods(ns).Create(gctx, p, metav1.CreateOptions{})
				return err
			})
		}
		for j := 0; j < sz.Events; j++ {
			g.Go(func() error {
				ev := &corev1.Event{
					ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("event-%02d", j), Namespace: ns},
					InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("pod-%02d", j), APIVersion: "v1"},
					Reason:         []string{"Scheduled", "Pulled"}[j%2],
					Type:           []string{"Normal", "Warning"}[j%2],
					Message:        "seeded",
				}
				_, err := kc.CoreV1().Events(ns).Create(gctx, ev, metav1.CreateOptions{})
				return err
			})
		}
		for j := 0; j < sz.Widgets; j++ {
			g.Go(func() error {
				w := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "example.cachetier.io/v1", "kind": "Widget",
					"metadata": map[string]any{"name": fmt.Sprintf("widget-%02d", j), "namespace": ns, "labels": map[string]any{"app": apps[j%3]}},
					"spec":     map[string]any{"color": []string{"red", "blue"}[j%2], "size": int64(j)},
				}}
				_, err := dyn.Resource(WidgetsGVR()).Namespace(ns).Create(gctx, w, metav1.CreateOptions{})
				return err
			})
		}
	}
	return g.Wait()
}

func createWidgetCRD(ctx context.Context, c apiextensionsclient.Interface) error {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.cachetier.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.cachetier.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList", ShortNames: []string{"wg"}},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"color": {Type: "string"}, "size": {Type: "integer"},
						}},
					},
				}},
				SelectableFields: []apiextensionsv1.SelectableField{{JSONPath: ".spec.color"}},
				// Printer columns for kubectl get; Size only with -o wide.
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Color", Type: "string", JSONPath: ".spec.color", Description: "The widget's color."},
					{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
			}},
		},
	}
	if _, err := c.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		return err
	}
	return WaitEstablished(ctx, c, crd.Name)
}

// WaitEstablished waits up to 30 s until the CRD name is Established: the
// apiserver serves its resources from then on.
func WaitEstablished(ctx context.Context, c apiextensionsclient.Interface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

package nodeinstall

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// The data the sample profile caches (config/samples): pods everywhere
// (some running on the node, some waiting for a node that does not exist),
// configmaps of namespaces labelled cachetier.io/cache=true, and
// cert-manager Certificates — Seed installs cert-manager's CRD as a cluster
// that runs cert-manager has it.
var (
	// CachedNamespaces are labelled cachetier.io/cache=true.
	CachedNamespaces = []string{"app-0", "app-1", "app-2"}
	// OtherNamespace is not: the sample caches only its pods.
	OtherNamespace = "plain"
	// CertificatesGVR is cert-manager's Certificate.
	CertificatesGVR = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificates"}
)

const (
	// ConfigMapsPerNamespace is how many ConfigMaps Seed creates in each
	// namespace.
	ConfigMapsPerNamespace = 120
	// RunningPodsPerNamespace run the pause image on the node (app=web).
	RunningPodsPerNamespace = 2
)

// Seed creates the sample data, with running pods on pauseImage, and
// waits for the running pods of the first namespace to turn Ready.
// Objects that exist already are left as they are.
func (in *Installer) Seed(ctx context.Context, pauseImage string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	kc := in.Client.CoreV1()
	for _, ns := range append(append([]string{}, CachedNamespaces...), OtherNamespace) {
		labels := map[string]string{}
		if ns != OtherNamespace {
			labels["cachetier.io/cache"] = "true"
		}
		if _, err := kc.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return err
		}
		for i := 0; i < ConfigMapsPerNamespace; i++ {
			if _, err := kc.ConfigMaps(ns).Create(ctx, SampleConfigMap(fmt.Sprintf("cm-%03d", i), i), metav1.CreateOptions{}); ignoreExists(err) != nil {
				return err
			}
		}
		for i := 0; i < RunningPodsPerNamespace; i++ {
			if _, err := kc.Pods(ns).Create(ctx, runningPod(i, pauseImage), metav1.CreateOptions{}); ignoreExists(err) != nil {
				return err
			}
		}
		// Asks for a node that does not exist: stays Pending, unscheduled.
		if _, err := kc.Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "unscheduled", Labels: map[string]string{"app": "waiting"}},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"cachetier.io/no-such-node": "true"},
				Containers:   []corev1.Container{{Name: "c", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
			},
		}, metav1.CreateOptions{}); ignoreExists(err) != nil {
			return err
		}
	}
	if err := in.seedCertificates(ctx); err != nil {
		return err
	}
	if err := in.Cluster.WaitPodsReady(ctx, CachedNamespaces[0], "app=web", RunningPodsPerNamespace, 2*time.Minute); err != nil {
		return fmt.Errorf("sample pods: %w", err)
	}
	return nil
}

func ignoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// SampleConfigMap is the i-th sample ConfigMap: labels app (a, b, c) and
// tier (x, y) cycle so label selectors pick a share, and a 512-byte value.
func SampleConfigMap(name string, i int) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": []string{"a", "b", "c"}[i%3], "tier": []string{"x", "y"}[i%2]}},
		Data:       map[string]string{"value": fmt.Sprintf("%0512d", i)},
	}
}

// runningPod runs the pause image as a restricted pod.
func runningPod(i int, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d", i), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "pause", Image: image, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}

// seedCertificates installs cert-manager's Certificate CRD (the schema
// reduced to what the samples set) and a few Certificates, one labelled
// cachetier.io/skip, which the sample's label selector leaves out.
func (in *Installer) seedCertificates(ctx context.Context) error {
	ac, err := apiextensionsclient.NewForConfig(in.Admin)
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "certificates.cert-manager.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "cert-manager.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "certificates", Singular: "certificate", Kind: "Certificate", ListKind: "CertificateList", ShortNames: []string{"cert", "certs"}},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"secretName": {Type: "string"},
							"dnsNames":   {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
						}},
					},
				}},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{
					{Name: "Secret", Type: "string", JSONPath: ".spec.secretName"},
					{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
				},
			}},
		},
	}
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(in.Admin)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < 6; i++ {
		ns := CachedNamespaces[i%len(CachedNamespaces)]
		labels := map[string]any{"team": []string{"red", "blue"}[i%2]}
		if i == 5 {
			labels["cachetier.io/skip"] = "true"
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
			"metadata": map[string]any{"name": fmt.Sprintf("cert-%d", i), "namespace": ns, "labels": labels},
			"spec":     map[string]any{"secretName": fmt.Sprintf("cert-%d-tls", i), "dnsNames": []any{fmt.Sprintf("svc-%d.example.test", i)}},
		}}
		for {
			_, err := dc.Resource(CertificatesGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
			if ignoreExists(err) == nil {
				break
			}
			// The CRD is served a moment after it is created.
			if time.Now().After(deadline) {
				return fmt.Errorf("create certificate: %w", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

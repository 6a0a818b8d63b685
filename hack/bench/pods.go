package main

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// The pods-like data set (-pod-count, -pod-size): Pods as a Deployment
// leaves them — labels, an owner reference, two containers with ports,
// env, resources, probes and volume mounts, volumes, tolerations — padded
// with an annotation so that each is about -pod-size bytes of JSON as the
// apiserver serves it (managedFields included). hack/controlplane runs no
// scheduler or kubelet: the Pods stay Pending, which changes nothing for
// LIST. Pods are a resource with field selectors beyond metadata
// (spec.nodeName, status.phase, ...), so the tier reads those values of
// each one at ingestion (fields.SetJSON), unlike ConfigMaps.

// podPaddingKey is the annotation that brings a Pod to the wanted size.
const podPaddingKey = "bench.cachetier.io/padding"

// benchPodName is the name of the data set's i-th Pod.
func benchPodName(i int) string {
	app, hash := benchPodApp(i)
	return fmt.Sprintf("%s-%s-%06d", app, hash[:6], i)
}

func benchPodApp(i int) (app, hash string) {
	return fmt.Sprintf("app-%03d", i%200), fmt.Sprintf("%010x", uint64(i%200)*2654435761)
}

// benchNodeName is the name of the data set's n-th node (-mode nodes:
// Pods are created bound to it; no Node object exists).
func benchNodeName(n int) string { return fmt.Sprintf("node-%05d", n) }

// benchPod is the data set's i-th Pod, bound to node when node is set.
func benchPod(i int, padding, node string) *corev1.Pod {
	app, hash := benchPodApp(i)
	ann := map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-11-21T10:00:00Z"}
	if padding != "" {
		ann[podPaddingKey] = padding
	}
	probe := &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 10, TimeoutSeconds: 1, FailureThreshold: 3, SuccessThreshold: 1,
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   benchPodName(i),
			Labels: map[string]string{"app": app, "pod-template-hash": hash, "tier": []string{"web", "api", "worker"}[i%3]},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-" + hash, UID: "3f1c6a52-9d1e-4c8b-a5b7-0d6e2f4a8c91",
				Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}},
			Annotations: ann,
		},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/team/" + app + ":v1.27.3",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{
					{Name: "LOG_LEVEL", Value: "info"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				LivenessProbe: probe, ReadinessProbe: probe,
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}},
			}, {
				Name: "sidecar", Image: "registry.example.com/platform/proxy:2.4.1",
				Args:      []string{"--upstream=127.0.0.1:8080", "--listen=:9090"},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}},
			}},
			Volumes:     []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// seedPods creates d.count Pods of about d.size bytes of JSON in ns, bound
// round-robin to d.nodes nodes when d.nodes > 0 (Pod i to node i mod
// d.nodes), and returns the size of their LIST.
func seedPods(ctx context.Context, kc kubernetes.Interface, ns string, d dataset, concurrency int) (int64, error) {
	node := func(i int) string {
		if d.nodes <= 0 {
			return ""
		}
		return benchNodeName(i % d.nodes)
	}
	pad, err := podPadding(ctx, kc, ns, d.size, node(0))
	if err != nil {
		return 0, err
	}
	err = createAll(ctx, 0, d.count, concurrency, func(ctx context.Context, i int) error {
		_, err := kc.CoreV1().Pods(ns).Create(ctx, benchPod(i, pad, node(i)), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return 0, err
	}
	return listSize(ctx, kc, ns, "pods")
}

// podPadding is the padding annotation's value that makes a Pod size bytes
// of JSON as the apiserver serves it (managedFields included): measured on
// a Pod created without padding, checked on one created with it (the
// padding's own managedFields entry, defaults), then both deleted. A size
// below the unpadded Pod's is an error (the bench once used the unpadded
// Pod silently: -pod-size 3072 gave 4,162 B Pods).
func podPadding(ctx context.Context, kc kubernetes.Interface, ns string, size int, node string) (string, error) {
	sizeWith := func(name, pad string) (int, error) {
		p := benchPod(0, pad, node)
		p.Name = name
		if _, err := kc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return 0, err
		}
		defer func() {
			_ = kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
		}()
		raw, err := kc.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name(name).SetHeader("Accept", "application/json").DoRaw(ctx)
		return len(raw), err
	}
	// Names as long as every Pod's.
	n := len(benchPodName(0))
	bare, err := sizeWith(strings.Repeat("c", n), "")
	if err != nil {
		return "", err
	}
	extra := size - bare
	if extra < 0 {
		// Padding cannot make a Pod smaller; a run with other Pods than
		// asked for would be reported under the size asked for.
		return "", fmt.Errorf("-pod-size %d is below the size of the bench's Pod without padding (%d B of JSON as the apiserver serves it): ask for at least %d", size, bare, bare)
	}
	if extra == 0 {
		return "", nil
	}
	// A first guess without the annotation's overhead, then corrected by
	// what the padded Pod actually measures.
	padded, err := sizeWith(strings.Repeat("d", n), strings.Repeat("p", extra))
	if err != nil {
		return "", err
	}
	if extra += size - padded; extra <= 0 {
		return "", nil
	}
	return strings.Repeat("p", extra), nil
}

package main

import (
	"context"
	"fmt"
	"strings"
	"sync"

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
// (spec.nodeName, status.phase, ...), so the tier decodes each one fully at
// ingestion, unlike ConfigMaps.

// podPaddingKey is the annotation that brings a Pod to the wanted size.
const podPaddingKey = "bench.cachetier.io/padding"

func benchPod(i int, padding string) *corev1.Pod {
	app := fmt.Sprintf("app-%03d", i%200)
	hash := fmt.Sprintf("%010x", uint64(i%200)*2654435761)
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
			Name:   fmt.Sprintf("%s-%s-%06d", app, hash[:6], i),
			Labels: map[string]string{"app": app, "pod-template-hash": hash, "tier": []string{"web", "api", "worker"}[i%3]},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-" + hash, UID: "3f1c6a52-9d1e-4c8b-a5b7-0d6e2f4a8c91",
				Controller: ptr(true), BlockOwnerDeletion: ptr(true),
			}},
			Annotations: ann,
		},
		Spec: corev1.PodSpec{
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

// seedPods creates d.count Pods of about d.size bytes of JSON in ns and
// returns the size of their LIST.
func seedPods(ctx context.Context, kc kubernetes.Interface, ns string, d dataset, concurrency int) (int64, error) {
	pods := kc.CoreV1().Pods(ns)
	// Calibrate: the first Pod without padding shows what the apiserver
	// adds (defaults, managedFields); the padding annotation (and its
	// managedFields entry) makes up the rest.
	first, err := pods.Create(ctx, benchPod(0, ""), metav1.CreateOptions{})
	if err != nil {
		return 0, err
	}
	raw, err := kc.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name(first.Name).DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	pad := ""
	if extra := d.size - len(raw) - len(`,"":""`) - len(podPaddingKey) - len(`,"f:":{}`) - len(podPaddingKey); extra > 0 {
		pad = strings.Repeat("p", extra)
	}
	work := make(chan int)
	errs := make(chan error, concurrency)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if _, err := pods.Create(ctx, benchPod(i, pad), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var seedErr error
loop:
	for i := 1; i < d.count; i++ {
		select {
		case work <- i:
		case seedErr = <-errs:
			break loop
		}
	}
	close(work)
	wg.Wait()
	if seedErr != nil {
		return 0, seedErr
	}
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	body, err := kc.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	return int64(len(body)), nil
}

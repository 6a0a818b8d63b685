package main

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// managerContainer is the manager's container name in config/manager.
const managerContainer = "manager"

// cacheServerImage decides the image fleets run when a profile names none.
// An explicit --cache-server-image or RELATED_IMAGE_CACHE_SERVER (what OLM
// and image mirroring set) wins. Otherwise it is the image of the manager's
// own container, read from its pod: one image carries both binaries, so
// whatever set the manager's image — kustomize images: in an overlay,
// `kubectl set image`, a Helm value — sets the fleets' too. A copy of the
// image in an environment variable would silently keep the old one.
func cacheServerImage(ctx context.Context, cfg *rest.Config, explicit, namespace, podName string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if podName == "" {
		return "", fmt.Errorf("no cache-server image: set --cache-server-image or RELATED_IMAGE_CACHE_SERVER, or run in a pod with POD_NAME set (config/manager does) to use the manager's own image")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	pod, err := cs.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the manager's own pod %s/%s for its image (needs get on pods; or set RELATED_IMAGE_CACHE_SERVER): %w", namespace, podName, err)
	}
	return containerImage(pod, managerContainer)
}

// containerImage is the image of the named container of pod, or of its only
// container.
func containerImage(pod *corev1.Pod, name string) (string, error) {
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return c.Image, nil
		}
	}
	if len(pod.Spec.Containers) == 1 {
		return pod.Spec.Containers[0].Image, nil
	}
	return "", fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, name)
}

func podNameFromEnv() string { return os.Getenv("POD_NAME") }

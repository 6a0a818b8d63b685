package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestContainerImage(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "sidecar", Image: "proxy:1"}, {Name: "manager", Image: "ghcr.io/cachetier/cachetier:dev-1"},
	}}}
	if got, err := containerImage(pod, "manager"); err != nil || got != "ghcr.io/cachetier/cachetier:dev-1" {
		t.Fatalf("named container: %q, %v", got, err)
	}
	single := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "renamed", Image: "x:2"}}}}
	if got, err := containerImage(single, "manager"); err != nil || got != "x:2" {
		t.Fatalf("only container: %q, %v", got, err)
	}
	pod.Spec.Containers[1].Name = "other"
	if _, err := containerImage(pod, "manager"); err == nil {
		t.Fatal("picked an image among containers none of which is the manager")
	}
}

func TestExplicitImageWinsAndNoPodIsAClearError(t *testing.T) {
	if got, err := cacheServerImage(context.Background(), nil, "mirror.example/cachetier:1", "ns", "pod"); err != nil || got != "mirror.example/cachetier:1" {
		t.Fatalf("explicit image: %q, %v", got, err)
	}
	_, err := cacheServerImage(context.Background(), nil, "", "ns", "")
	if err == nil || !strings.Contains(err.Error(), "RELATED_IMAGE_CACHE_SERVER") || !strings.Contains(err.Error(), "POD_NAME") {
		t.Fatalf("want an error naming both ways to set the image, got %v", err)
	}
}

package nodeinstall

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// TestOverlaySetsTheManagerImage renders the overlay a user writes with
// kubectl's kustomize: the manager Deployment runs exactly the image given,
// which is also the image its fleets run (the manager reads its own pod).
func TestOverlaySetsTheManagerImage(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := controlplane.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	base, err := filepath.Rel(overlay, filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	const ref = "ghcr.io/cachetier/cachetier:dev-0123456789ab"
	k, err := Overlay(base, ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "kubectl"), "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	var images []string
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if !strings.Contains(doc, "kind: Deployment") {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			images = append(images, c.Image)
		}
	}
	if len(images) != 1 || images[0] != ref {
		t.Fatalf("Deployment images %v, want [%s]", images, ref)
	}
}

func TestOverlayTagParsing(t *testing.T) {
	for _, ref := range []string{"ghcr.io/cachetier/cachetier", "localhost:5000/cachetier", "ghcr.io/cachetier/cachetier@sha256:00"} {
		if _, err := Overlay("../config/default", ref); err == nil {
			t.Errorf("Overlay(%q) accepted a ref without a tag", ref)
		}
	}
	k, err := Overlay("../config/default", "localhost:5000/cachetier:v1")
	if err != nil || !strings.Contains(k, "name: localhost:5000/cachetier\n  newTag: v1\n") {
		t.Fatalf("registry with a port: %v\n%s", err, k)
	}
}

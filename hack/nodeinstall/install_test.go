package nodeinstall

import (
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
	const ref = "ghcr.io/cachetier/cachetier:dev-0123456789ab"
	out := renderOverlay(t, ref, "default")
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

// TestOverlayWithPrometheus renders config/default with config/prometheus,
// as e2e/observability installs them: the manager's ServiceMonitor and the
// operator-wide PrometheusRule come along, labelled for the Prometheus
// resource's selectors (MonitorLabel).
func TestOverlayWithPrometheus(t *testing.T) {
	out := renderOverlay(t, "ghcr.io/cachetier/cachetier:v1", "default", "prometheus")
	kinds := map[string]int{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var obj struct {
			Kind     string
			Metadata struct{ Labels map[string]string }
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "ServiceMonitor" && obj.Kind != "PrometheusRule" {
			continue
		}
		kinds[obj.Kind]++
		if obj.Metadata.Labels[MonitorLabel] != MonitorLabelValue {
			t.Errorf("%s labels %v: want %s", obj.Kind, obj.Metadata.Labels, MonitorLabelSelector)
		}
	}
	if kinds["ServiceMonitor"] != 1 || kinds["PrometheusRule"] != 1 {
		t.Errorf("rendered %v, want one ServiceMonitor and one PrometheusRule", kinds)
	}
}

// renderOverlay writes the overlay a user writes for ref over the named
// directories of config/ and renders it with kubectl's kustomize.
func renderOverlay(t *testing.T, ref string, configDirs ...string) []byte {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := controlplane.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	var dirs []string
	for _, d := range configDirs {
		dirs = append(dirs, filepath.Join("config", d))
	}
	if err := WriteOverlay(overlay, root, ref, dirs...); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "kubectl"), "kustomize", overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	return out
}

// Package nodeinstall installs cachetier on a real node cluster
// (hack/cluster) the way a user does: the operator from the project's image
// with `kubectl apply -k config/default` (the image set by kustomize's
// images: in an overlay), sample data, and the sample CacheProfile with
// `kubectl apply -k config/samples`, then waits for the profile to turn
// Available on its pods' real readiness. `make run CLUSTER=node` and the
// end-to-end test (e2e/install) share it, so what a person tries is what
// the test proves.
package nodeinstall

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/imagebuild"
)

const (
	// OperatorNamespace is config/default's namespace; the sample
	// profile's fleet runs there too.
	OperatorNamespace = "cachetier-system"
	// SampleProfile is config/samples' CacheProfile.
	SampleProfile = "fleet"
	// ManagerSelector selects the manager's pods, of the Deployment
	// ManagerDeployment.
	ManagerSelector   = "app.kubernetes.io/component=manager"
	ManagerDeployment = "cachetier-controller-manager"
)

// Installer installs cachetier from the repository at Root onto Cluster.
type Installer struct {
	Cluster *cluster.Cluster
	Client  kubernetes.Interface
	Admin   *rest.Config
	// Root is the repository: config/default and config/samples.
	Root string
	// Dir receives the kustomize overlay.
	Dir string
	// Image is cachetier's image, imported into the node.
	Image imagebuild.Image
	// Images are all the images imported into the nodes (StartNodes).
	Images []imagebuild.Image
}

// New returns an installer for c with an admin client.
func New(c *cluster.Cluster, root, dir string, image imagebuild.Image) (*Installer, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Installer{Cluster: c, Client: kc, Admin: cfg, Root: root, Dir: dir, Image: image}, nil
}

// NodeOptions are the cluster options for a node that runs cachetier from
// images `make image` built: all of them imported, the pause image as the
// sandbox, CoreDNS as cluster DNS.
func NodeOptions(images []imagebuild.Image, log io.Writer) cluster.Options {
	opts := cluster.Options{Log: log, ReadyTimeout: 3 * time.Minute}
	for _, img := range images {
		opts.Images = append(opts.Images, cluster.Image{Ref: img.Ref, Archive: img.Tar})
		switch img.Name {
		case imagebuild.Pause:
			opts.PauseImage = img.Ref
		case imagebuild.CoreDNS:
			opts.CoreDNSImage = img.Ref
		}
	}
	return opts
}

// ImageNames are the images a node running cachetier needs.
func ImageNames() []string {
	return []string{imagebuild.Cachetier, imagebuild.Pause, imagebuild.CoreDNS}
}

// splitImageRef splits repository:tag. The tag follows the last colon
// after the last slash (a registry host may carry a port); a digest
// reference is refused: kustomize's newTag could not express it.
func splitImageRef(ref string) (repo, tag string, err error) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") || strings.Contains(ref, "@") {
		return "", "", fmt.Errorf("image ref %q is not repository:tag", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// Overlay is the kustomization a user writes to install a given image:
// config/default (at base, relative to the overlay) and any further bases
// (config/prometheus where the Prometheus Operator runs), with the image's
// tag set by kustomize's images: transformer.
func Overlay(base, imageRef string, more ...string) (string, error) {
	repo, tag, err := splitImageRef(imageRef)
	if err != nil {
		return "", err
	}
	resources := "- " + base + "\n"
	for _, m := range more {
		resources += "- " + m + "\n"
	}
	return fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
%simages:
- name: %s
  newTag: %s
`, resources, repo, tag), nil
}

// WriteOverlay writes Overlay into dir/kustomization.yaml for the
// directories configDirs of the repository at root (config/default first).
func WriteOverlay(dir, root, imageRef string, configDirs ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var bases []string
	for _, d := range configDirs {
		rel, err := filepath.Rel(dir, filepath.Join(root, d))
		if err != nil {
			return err
		}
		bases = append(bases, rel)
	}
	if len(bases) == 0 {
		return fmt.Errorf("overlay %s: no config directory", dir)
	}
	k, err := Overlay(bases[0], imageRef, bases[1:]...)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// InstallOperator writes the overlay, applies it with kubectl and waits
// for every manager pod to turn Ready. It returns how long that took.
// configDirs (relative to Root, e.g. "config/prometheus") are installed
// with config/default.
func (in *Installer) InstallOperator(ctx context.Context, timeout time.Duration, configDirs ...string) (time.Duration, error) {
	overlay := filepath.Join(in.Dir, "overlay")
	dirs := append([]string{filepath.Join("config", "default")}, configDirs...)
	if err := WriteOverlay(overlay, in.Root, in.Image.Ref, dirs...); err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, "apply", "--request-timeout=1m", "-k", overlay); err != nil {
		return 0, err
	}
	d, err := in.Client.AppsV1().Deployments(OperatorNamespace).Get(ctx, ManagerDeployment, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if err := in.Cluster.WaitPodsReady(ctx, OperatorNamespace, ManagerSelector, int(*d.Spec.Replicas), timeout); err != nil {
		return 0, fmt.Errorf("manager pods: %w", err)
	}
	return time.Since(start), nil
}

// ApplySample applies config/samples (the sample CacheProfile) and waits
// until the profile has settled: Available, neither Progressing nor
// Degraded, for its current generation. It returns the profile and how long
// that took from the apply.
func (in *Installer) ApplySample(ctx context.Context, timeout time.Duration) (*cachev1alpha1.CacheProfile, time.Duration, error) {
	start := time.Now()
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, "apply", "--request-timeout=1m", "-k", filepath.Join(in.Root, "config", "samples")); err != nil {
		return nil, 0, err
	}
	p, err := in.WaitProfile(ctx, "Available", timeout, Settled)
	if err != nil {
		return nil, 0, err
	}
	return p, time.Since(start), nil
}

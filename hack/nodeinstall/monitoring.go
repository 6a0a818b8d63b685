package nodeinstall

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/hack/imagebuild"
)

// The monitoring stack a cluster operator runs next to cachetier, as
// kube-prometheus installs it: the Prometheus Operator (its own CRDs, RBAC
// and Deployment, from the operator's module as upstream publishes them)
// and one Prometheus resource that selects cachetier's ServiceMonitors and
// PrometheusRules in every namespace.
const (
	// MonitoringNamespace is kube-prometheus' namespace.
	MonitoringNamespace = "monitoring"
	// PromOperatorSelector selects the operator's pod.
	PromOperatorSelector = "app.kubernetes.io/name=prometheus-operator"
	// PrometheusName is the Prometheus resource; the operator names its
	// StatefulSet prometheus-<name> and labels the pods prometheus=<name>.
	PrometheusName = "cachetier"
	// MonitorLabel=MonitorLabelValue is the label the Prometheus resource
	// selects ServiceMonitors and PrometheusRules by: every one cachetier
	// ships or renders carries it.
	MonitorLabel         = "app.kubernetes.io/part-of"
	MonitorLabelValue    = "cachetier"
	MonitorLabelSelector = MonitorLabel + "=" + MonitorLabelValue
)

// MonitoringImages are the imagebuild images InstallPrometheusOperator and
// StartPrometheus run; StartNodes must have imported them.
func MonitoringImages() []string {
	return []string{imagebuild.PromOperator, imagebuild.ConfigReloader, imagebuild.Prometheus}
}

// upstreamOperatorFiles are the operator's install files in its module
// (example/rbac/prometheus-operator), less its own ServiceMonitor and
// Service: only cachetier is scraped here.
var upstreamOperatorFiles = []string{
	"prometheus-operator-service-account.yaml",
	"prometheus-operator-cluster-role.yaml",
	"prometheus-operator-cluster-role-binding.yaml",
	"prometheus-operator-deployment.yaml",
}

// upstreamPrometheusFiles are the Prometheus server's RBAC in the module
// (example/rbac/prometheus): discovery of Services, Endpoints(Slices) and
// Pods, and GET /metrics, which the manager's metrics endpoint authorizes.
var upstreamPrometheusFiles = []string{
	"prometheus-service-account.yaml",
	"prometheus-cluster-role.yaml",
	"prometheus-cluster-role-binding.yaml",
}

func (in *Installer) image(name string) (imagebuild.Image, error) {
	img, ok := imagebuild.Find(in.Images, name)
	if !ok {
		return img, fmt.Errorf("image %s was not imported into the node (StartNodes with it)", name)
	}
	return img, nil
}

// InstallPrometheusOperator installs the Prometheus Operator into
// MonitoringNamespace the way its users do: upstream's CRDs (full schemas)
// and install files through a kustomization that sets the namespace and
// the images, applied server-side (several CRDs are larger than
// client-side apply's last-applied annotation may be). It waits until the
// CRDs are Established and the operator is Ready.
func (in *Installer) InstallPrometheusOperator(ctx context.Context, timeout time.Duration) error {
	opImg, err := in.image(imagebuild.PromOperator)
	if err != nil {
		return err
	}
	reloader, err := in.image(imagebuild.ConfigReloader)
	if err != nil {
		return err
	}
	src, err := imagebuild.PromOperatorDir(ctx, in.Root)
	if err != nil {
		return err
	}
	dir := filepath.Join(in.Dir, "prometheus-operator")
	crdDir := filepath.Join(src, "example", "prometheus-operator-crd")
	crds, err := filepath.Glob(filepath.Join(crdDir, "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("no CRDs in %s: %v", crdDir, err)
	}
	files := append([]string{}, crds...)
	for _, f := range upstreamOperatorFiles {
		files = append(files, filepath.Join(src, "example", "rbac", "prometheus-operator", f))
	}
	repo, tag, err := splitImageRef(opImg.Ref)
	if err != nil {
		return err
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
- namespace.yaml
%simages:
- name: quay.io/prometheus-operator/prometheus-operator
  newName: %s
  newTag: %s
patches:
# The reloader the operator adds to every Prometheus pod: ours.
- target: {kind: Deployment, name: prometheus-operator}
  patch: |-
    - op: test
      path: /spec/template/spec/containers/0/args/1
      value: --prometheus-config-reloader=quay.io/prometheus-operator/prometheus-config-reloader:v0.85.0
    - op: replace
      path: /spec/template/spec/containers/0/args/1
      value: --prometheus-config-reloader=%s
# ServiceMonitors get a status: whether each Prometheus accepted them.
- target: {kind: Deployment, name: prometheus-operator}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --feature-gates=StatusForConfigurationResources=true
`, MonitoringNamespace, resourceList(files), repo, tag, reloader.Ref)
	if err := writeKustomization(dir, k, files); err != nil {
		return err
	}
	ns := fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", MonitoringNamespace)
	if err := os.WriteFile(filepath.Join(dir, "namespace.yaml"), []byte(ns), 0o644); err != nil {
		return err
	}
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, "apply", "--server-side", "--request-timeout=2m", "-k", dir); err != nil {
		return err
	}
	args := []string{"wait", "--for=condition=Established", "--timeout=" + timeout.String()}
	for _, f := range crds {
		// monitoring.coreos.com_servicemonitors.yaml -> servicemonitors.monitoring.coreos.com
		g, plural, _ := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".yaml"), "_")
		args = append(args, "crd/"+plural+"."+g)
	}
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, args...); err != nil {
		return err
	}
	if err := in.Cluster.WaitPodsReady(ctx, MonitoringNamespace, PromOperatorSelector, 1, timeout); err != nil {
		return fmt.Errorf("prometheus operator: %w", err)
	}
	return nil
}

// Prometheus is the operator-managed Prometheus StartPrometheus created.
type Prometheus struct {
	// Version is the release its spec.version names (the image's).
	Version string
	// Pod is its pod (replica 0); URL its HTTP API at the pod's IP.
	Pod, URL string
}

// StartPrometheus creates a Prometheus resource in MonitoringNamespace with
// upstream's RBAC for it, selecting every ServiceMonitor and PrometheusRule
// labelled MonitorLabel in any namespace, as a kube-prometheus user
// points theirs at cachetier, and waits until the operator's pod for it is
// Ready. evaluationInterval is the rules' (the scrape interval is the
// operator's default, 30 s, where a ServiceMonitor sets none).
func (in *Installer) StartPrometheus(ctx context.Context, evaluationInterval string, timeout time.Duration) (*Prometheus, error) {
	img, err := in.image(imagebuild.Prometheus)
	if err != nil {
		return nil, err
	}
	src, err := imagebuild.PromOperatorDir(ctx, in.Root)
	if err != nil {
		return nil, err
	}
	// The image's tag is v<release>-<digest>; spec.version tells the
	// operator which release's flags to render.
	_, tag, err := splitImageRef(img.Ref)
	if err != nil {
		return nil, err
	}
	version, _, _ := strings.Cut(tag, "-")
	var files []string
	for _, f := range upstreamPrometheusFiles {
		files = append(files, filepath.Join(src, "example", "rbac", "prometheus", f))
	}
	dir := filepath.Join(in.Dir, "prometheus")
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: %s
resources:
%s- prometheus.yaml
`, MonitoringNamespace, resourceList(files))
	prom := fmt.Sprintf(`apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata:
  name: %s
spec:
  version: %s
  image: %s
  replicas: 1
  serviceAccountName: prometheus
  evaluationInterval: %s
  serviceMonitorSelector:
    matchLabels: {%[5]s: %[6]s}
  serviceMonitorNamespaceSelector: {}
  ruleSelector:
    matchLabels: {%[5]s: %[6]s}
  ruleNamespaceSelector: {}
  # Requests as a cluster operator sizes it (kube-prometheus asks 400Mi).
  # Without any, the pod is BestEffort: its cgroup's cpu.weight is 1,
  # against 4 for each fleet pod and 100 for the host's other work on two
  # cores, and a Prometheus that cannot answer the liveness probe
  # (/-/healthy, 3 s, six misses) is restarted; CI saw one restart
  # mid-test, which loses the alerts' pending state. 500m is weight 20.
  resources:
    requests: {cpu: 500m, memory: 400Mi}
`, PrometheusName, version, img.Ref, evaluationInterval, MonitorLabel, MonitorLabelValue)
	if err := writeKustomization(dir, k, files); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yaml"), []byte(prom), 0o644); err != nil {
		return nil, err
	}
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, "apply", "--server-side", "--request-timeout=1m", "-k", dir); err != nil {
		return nil, err
	}
	selector := "prometheus=" + PrometheusName
	if err := in.Cluster.WaitPodsReady(ctx, MonitoringNamespace, selector, 1, timeout); err != nil {
		return nil, fmt.Errorf("prometheus %s/%s: %w", MonitoringNamespace, PrometheusName, err)
	}
	pods, err := in.Client.CoreV1().Pods(MonitoringNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	if len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		return nil, fmt.Errorf("prometheus %s/%s: want one pod with an IP, have %d", MonitoringNamespace, PrometheusName, len(pods.Items))
	}
	p := pods.Items[0]
	return &Prometheus{Version: version, Pod: p.Name, URL: "http://" + p.Status.PodIP + ":9090"}, nil
}

// resourceList is a kustomization's resources: entries for files, which
// writeKustomization copies next to it (kustomize reads nothing outside
// the kustomization's directory).
func resourceList(files []string) string {
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "- %s\n", filepath.Base(f))
	}
	return b.String()
}

// writeKustomization writes kustomization.yaml into dir, with copies of
// files.
func writeKustomization(dir, kustomization string, files []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644)
}

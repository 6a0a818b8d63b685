package imagebuild

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cachetier/cachetier/hack/ociimage"
)

// The monitoring stack e2e/observability runs on the test node, as a
// cluster operator runs kube-prometheus: the Prometheus Operator, its
// config reloader (the sidecar the operator adds to every Prometheus pod)
// and the Prometheus server, each built from the Go module proxy at the
// exact versions their build modules pin.
const (
	promOperatorModule = "github.com/prometheus-operator/prometheus-operator"
	prometheusModule   = "github.com/prometheus/prometheus"

	promOperatorRepo   = "localhost/cachetier/prometheus-operator"
	configReloaderRepo = "localhost/cachetier/prometheus-config-reloader"
	prometheusRepo     = "localhost/cachetier/prometheus"

	// commonVersion is where Prometheus projects' binaries read their
	// version (build_info metrics, --version, the operator's defaults).
	commonVersion = "github.com/prometheus/common/version.Version"

	// nobodyUID is the user upstream's Prometheus, operator and reloader
	// images run as.
	nobodyUID = 65534
)

// PrometheusRelease is the Prometheus release a github.com/prometheus/prometheus
// module version carries: since 3.0 the module is versioned v0.MMmmm.p for
// release M.mm.p (v0.316.0 is 3.16.0). The operator renders flags for the
// release a Prometheus resource's spec.version names, so the test sets it
// from this.
func PrometheusRelease(moduleVersion string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(moduleVersion, "v"), ".")
	if len(parts) != 3 || parts[0] != "0" || !strings.HasPrefix(moduleVersion, "v") {
		return "", fmt.Errorf("prometheus module version %q: want v0.<major><minor>.<patch>", moduleVersion)
	}
	mm, err := strconv.Atoi(parts[1])
	if err != nil || mm < 300 {
		return "", fmt.Errorf("prometheus module version %q: want v0.<major><minor>.<patch> of a 3.x release or later", moduleVersion)
	}
	if _, err := strconv.Atoi(parts[2]); err != nil {
		return "", fmt.Errorf("prometheus module version %q: patch %q is not a number", moduleVersion, parts[2])
	}
	return fmt.Sprintf("%d.%d.%s", mm/100, mm%100, parts[2]), nil
}

// buildPromOperator builds the operator or its reloader from
// hack/promoperator-build, version-stamped as upstream's release is
// (the operator derives its default reloader image and its build_info from
// it).
func buildPromOperator(ctx context.Context, root, binDir, cmd string) (version string, err error) {
	module := filepath.Join(root, "hack", "promoperator-build")
	if version, err = moduleVersion(ctx, module, promOperatorModule); err != nil {
		return "", err
	}
	return version, goBuild(ctx, module, filepath.Join(binDir, cmd), promOperatorModule+"/cmd/"+cmd,
		goFlags{ldflags: "-X " + commonVersion + "=" + strings.TrimPrefix(version, "v")})
}

// buildPrometheus builds the server from hack/prometheus-build with only
// Kubernetes service discovery (plus the file, HTTP and static ones every
// build keeps): the operator's configurations use nothing else. No
// builtinassets tag: the web UI's assets are built by npm and are not in
// the module, so the UI pages answer 500 while the API, /-/ready and
// /-/healthy (the operator's probes) work.
func buildPrometheus(ctx context.Context, root, binDir string) (release string, err error) {
	module := filepath.Join(root, "hack", "prometheus-build")
	version, err := moduleVersion(ctx, module, prometheusModule)
	if err != nil {
		return "", err
	}
	if release, err = PrometheusRelease(version); err != nil {
		return "", err
	}
	return release, goBuild(ctx, module, filepath.Join(binDir, "prometheus"), prometheusModule+"/cmd/prometheus",
		goFlags{tags: "remove_all_sd,enable_kubernetes_sd", ldflags: "-X " + commonVersion + "=" + release})
}

// promOperatorSpec is upstream's operator image: /bin/operator as nobody.
func promOperatorSpec(binDir, version string) ociimage.Spec {
	return binaryAt(binDir, "operator", "/bin/operator", nobodyUID, map[string]string{
		"org.opencontainers.image.source":      "https://github.com/prometheus-operator/prometheus-operator",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.description": "Prometheus Operator " + version + " (cachetier hack/promoperator-build)",
	})
}

// configReloaderSpec is upstream's reloader image. The path matters: the
// operator runs the sidecar with the command
// /bin/prometheus-config-reloader, whatever the image's entrypoint.
func configReloaderSpec(binDir, version string) ociimage.Spec {
	return binaryAt(binDir, "prometheus-config-reloader", "/bin/prometheus-config-reloader", nobodyUID, map[string]string{
		"org.opencontainers.image.source":      "https://github.com/prometheus-operator/prometheus-operator",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.description": "Prometheus Operator config reloader " + version + " (cachetier hack/promoperator-build)",
	})
}

// prometheusSpec is upstream's Prometheus image as far as the operator uses
// it: entrypoint /bin/prometheus (the operator sets only its arguments),
// working directory /prometheus owned by nobody. The operator mounts the
// configuration, rules and TSDB volumes itself.
func prometheusSpec(binDir, release string) ociimage.Spec {
	s := binaryAt(binDir, "prometheus", "/bin/prometheus", nobodyUID, map[string]string{
		"org.opencontainers.image.source":      "https://github.com/prometheus/prometheus",
		"org.opencontainers.image.version":     release,
		"org.opencontainers.image.description": "Prometheus " + release + " with Kubernetes service discovery only (cachetier hack/prometheus-build)",
	})
	s.Files = append(s.Files, ociimage.File{Path: "/prometheus", Mode: fs.ModeDir | 0o755, UID: nobodyUID, GID: nobodyUID})
	s.Config.WorkingDir = "/prometheus"
	return s
}

// PromOperatorDir is the Prometheus Operator module's source directory
// (in the module cache) at the version hack/promoperator-build pins: its
// example/ holds the operator's CRDs with their full schemas and the RBAC
// and Deployment upstream installs it with.
func PromOperatorDir(ctx context.Context, root string) (string, error) {
	dir, err := moduleField(ctx, filepath.Join(root, "hack", "promoperator-build"), promOperatorModule, "{{.Dir}}")
	if err != nil {
		return "", err
	}
	if dir == "" {
		return "", fmt.Errorf("%s is not in the module cache (build the %s image first)", promOperatorModule, PromOperator)
	}
	return dir, nil
}

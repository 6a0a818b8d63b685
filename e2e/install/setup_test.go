// Package install runs cachetier as users install it, on a real one-node
// cluster (hack/cluster: kubelet, containerd, runc, kube-proxy, CoreDNS,
// kube-controller-manager, kube-scheduler): the operator from the project's
// image installed with `kubectl apply -k config/default`, the sample
// profile from `kubectl apply -k config/samples`, its fleet as pods, and
// kubectl and client-go reading through the profile's status.serverURL —
// compared with the apiserver throughout, including while pods, the manager,
// certificates and the shard count change underneath.
package install

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/imagebuild"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

const (
	operatorNamespace = nodeinstall.OperatorNamespace
	profileName       = nodeinstall.SampleProfile // config/samples
	group             = profileName + ".cache.cachetier.io"
	nodeName          = cluster.NodeName // where the running pods are
)

var cachedNamespaces = nodeinstall.CachedNamespaces

// env is one installed cluster shared by the user story's steps.
type env struct {
	in         *nodeinstall.Installer
	root       string
	c          *cluster.Cluster
	kc         kubernetes.Interface
	admin      *rest.Config
	kubeconfig string           // the apiserver's admin kubeconfig
	image      imagebuild.Image // cachetier's
	pause      string           // the pause image's ref, for sample pods
	dir        string
}

// startCluster starts a node with the images (cachetier, pause, CoreDNS);
// the cluster is torn down when the test ends, and the teardown must leave
// nothing behind.
func startCluster(t *testing.T) *env {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, dir: t.TempDir()}
	in, opts, err := nodeinstall.StartNode(context.Background(), root, e.dir, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Teardown(); err != nil {
			t.Error(err)
		}
	})
	e.in, e.c, e.image, e.pause = in, in.Cluster, in.Image, opts.PauseImage
	e.kc, e.admin, e.kubeconfig = e.in.Client, e.in.Admin, e.c.AdminKubeconfig
	return e
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// kubectlResult is one kubectl run.
type kubectlResult struct {
	args           []string
	stdout, stderr string
	err            error
}

func (r kubectlResult) String() string {
	return fmt.Sprintf("kubectl %s: err=%v\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.err, clip(r.stdout), clip(r.stderr))
}

func clip(s string) string {
	if len(s) > 3000 {
		return s[:3000] + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return s
}

func (e *env) kubectl(t *testing.T, kubeconfig string, args ...string) kubectlResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.c.Kubectl(), append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return kubectlResult{args: args, stdout: out.String(), stderr: errb.String(), err: err}
}

func (e *env) mustKubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	r := e.kubectl(t, kubeconfig, args...)
	if r.err != nil {
		t.Fatalf("%s", r)
	}
	return r.stdout
}

// kubeconfigFor writes a copy of kubeconfig whose server is server.
func (e *env) kubeconfigFor(t *testing.T, kubeconfig, server, name string) string {
	t.Helper()
	out := filepath.Join(e.dir, name)
	if err := controlplane.RewriteKubeconfig(kubeconfig, out, server, nil, ""); err != nil {
		t.Fatal(err)
	}
	return out
}

func restConfig(t *testing.T, kubeconfig string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg
}

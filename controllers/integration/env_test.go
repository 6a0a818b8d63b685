// Package integration runs the CacheProfile reconciler against a real
// kube-apiserver and etcd (controller-runtime envtest), including the real
// aggregation layer checking the APIService the operator registers.
package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
)

// KubeVersion is the control plane the foundation issue builds into
// bin/k8s/<KubeVersion>-linux-amd64.
const KubeVersion = "v1.37.1"

// Namespace of the operator and the fleets, and the operator's identity,
// as installed by config/default.
const (
	workloadNamespace      = "cachetier-system"
	operatorServiceAccount = "cachetier-controller-manager"
)

// RepoRoot finds the module root from the test's working directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		t.Fatal("not inside the cachetier module")
	}
	return filepath.Dir(mod)
}

// Assets returns the directory with kube-apiserver, etcd and kubectl:
// KUBEBUILDER_ASSETS if set, else the repository's bin/k8s directory. A
// missing binary fails the test: skipping would let CI pass without ever
// exercising the reconciler against a real apiserver.
func Assets(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), "bin", "k8s", KubeVersion+"-linux-amd64")
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("control plane binary %s missing in %s (run `make controlplane`, which `make test` does first, or set KUBEBUILDER_ASSETS): %v", b, dir, err)
		}
	}
	return dir
}

// writeCounter counts requests that change state, to prove that
// reconciling an unchanged profile writes nothing.
type writeCounter struct {
	next   http.RoundTripper
	writes *atomic.Int64
	log    *atomic.Value // last write, for failure messages
}

func (w writeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		w.writes.Add(1)
		w.log.Store(r.Method + " " + r.URL.Path)
	}
	return w.next.RoundTrip(r)
}

// harness is one control plane plus a running manager.
type harness struct {
	env        *envtest.Environment
	cfg        *rest.Config
	client     client.Client // the test's own client (not counted)
	scheme     *runtime.Scheme
	reconciler *controllers.CacheProfileReconciler
	writes     *atomic.Int64
	lastWrite  *atomic.Value
	clockSkew  *atomic.Int64        // added to time.Now by the reconciler's clock
	front      *http.Server         // the fake front, when running
	metrics    *prometheus.Registry // the reconciler's ProfileMetrics
	t          *testing.T           // the top-level test, for cleanups outliving subtests
}

// frontClusterIP: the apiserver's service range is moved into 127/8 so the
// aggregator's dial of the front Service's ClusterIP reaches a server this
// test runs on the loopback interface.
const (
	serviceCIDR    = "127.0.100.0/24"
	frontClusterIP = "127.0.100.50"
	frontPort      = 18443
)

func startHarness(t *testing.T) *harness {
	t.Helper()
	root := RepoRoot(t)
	// The CRD, the operator's RBAC and Deployment come from the kustomize
	// install (config/default), applied with kubectl like a user would; the
	// manager then runs in process with the operator ServiceAccount's
	// identity, so missing RBAC fails these tests.
	env := &envtest.Environment{BinaryAssetsDirectory: Assets(t)}
	env.ControlPlane.GetAPIServer().Configure().Set("service-cluster-ip-range", serviceCIDR)
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := controllers.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	installWithKustomize(t, env, root)
	eventually(t, 30*time.Second, "CacheProfile API served", func() error {
		return c.List(ctx, &cachev1alpha1.CacheProfileList{})
	})

	h := &harness{env: env, cfg: cfg, client: c, scheme: scheme, writes: &atomic.Int64{}, lastWrite: &atomic.Value{}, clockSkew: &atomic.Int64{}, t: t,
		metrics: prometheus.NewRegistry()}
	mgrCfg := rest.CopyConfig(cfg)
	mgrCfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + workloadNamespace + ":" + operatorServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + workloadNamespace, "system:authenticated"},
	}
	mgrCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return writeCounter{next: rt, writes: h.writes, log: h.lastWrite}
	})
	logf := zap.New(zap.WriteTo(testWriter{t}), zap.UseDevMode(true))
	ctrl.SetLogger(logf)
	mgr, err := ctrl.NewManager(mgrCfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  controllers.CacheOptions(workloadNamespace),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.reconciler = &controllers.CacheProfileReconciler{
		Client:   mgr.GetClient(),
		Scheme:   scheme,
		Recorder: mgr.GetEventRecorder("cachetier-operator"),
		Options:  controllers.Options{Namespace: workloadNamespace, DefaultImage: "example.com/cachetier/cache-server:test", APIServerURL: cfg.Host},
		Metrics:  controllers.NewProfileMetrics(h.metrics, mgr.GetCache()),
		Now:      func() time.Time { return time.Now().Add(time.Duration(h.clockSkew.Load())) },
		Rand:     rand.Reader,
	}
	// The impersonation is effective and the operator's RBAC is narrow: it
	// cannot read Secrets outside its namespace.
	opClient, err := client.New(mgrCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := opClient.List(ctx, &corev1.SecretList{}, client.InNamespace("kube-system")); !apierrors.IsForbidden(err) {
		t.Fatalf("the operator's identity can list Secrets in kube-system (err=%v): RBAC too broad or impersonation not in effect", err)
	}
	if err := h.reconciler.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(log.IntoContext(ctx, logf))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return h
}

// installWithKustomize runs `kubectl apply --server-side -k config/default`
// against the control plane and checks the operator's objects exist.
func installWithKustomize(t *testing.T, env *envtest.Environment, root string) {
	t.Helper()
	stdout, stderr, err := env.ControlPlane.KubeCtl().Run("apply", "--server-side", "-k", filepath.Join(root, "config", "default"))
	if err != nil {
		out, _ := io.ReadAll(stdout)
		errOut, _ := io.ReadAll(stderr)
		t.Fatalf("kubectl apply -k config/default: %v\n%s\n%s", err, out, errOut)
	}
	out, _ := io.ReadAll(stdout)
	// The sample profile is valid against the installed schema.
	if _, stderr, err := env.ControlPlane.KubeCtl().Run("apply", "--dry-run=server", "-k", filepath.Join(root, "config", "samples")); err != nil {
		errOut, _ := io.ReadAll(stderr)
		t.Errorf("sample profile refused: %v\n%s", err, errOut)
	}
	for _, want := range []string{
		"namespace/cachetier-system serverside-applied",
		"customresourcedefinition.apiextensions.k8s.io/cacheprofiles.cachetier.io serverside-applied",
		"deployment.apps/cachetier-controller-manager serverside-applied",
		"clusterrole.rbac.authorization.k8s.io/cachetier-manager-role serverside-applied",
		"role.rbac.authorization.k8s.io/cachetier-manager-role serverside-applied",
		"rolebinding.rbac.authorization.k8s.io/cachetier-manager-rolebinding serverside-applied",
		"serviceaccount/cachetier-controller-manager serverside-applied",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl apply output lacks %q:\n%s", want, out)
		}
	}
}

// testWriter sends logs to t.Log only while the test runs; logs from
// goroutines after the test ended are dropped instead of panicking.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	if os.Getenv("CACHETIER_TEST_LOGS") != "" {
		fmt.Fprint(os.Stderr, string(p))
	}
	return len(p), nil
}

// eventually polls f until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
}

// Package e2e tests the standalone tier end to end: a real kube-apiserver
// and etcd (hack/controlplane), the tier in front of them, and real clients
// (HTTP requests compared with the apiserver's answers, kubectl, client-go).
package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/standalone"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/internal/pki"
)

// env is shared by the package's tests: starting a control plane and
// seeding it costs seconds, and every test reads the same data set.
type env struct {
	cp *controlplane.ControlPlane
	// admin talks to the apiserver; tierAdmin to the tier with the same
	// identity (the admin client certificate).
	admin, tierAdmin *rest.Config
	tierKubeconfig   string
	tierURL          string
	cancelTier       context.CancelFunc
	tierDone         chan error
}

var testEnv *env

const profileName = "e2e"

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx := context.Background()
	cp, err := controlplane.Start(ctx, controlplane.Options{ServiceClusterIPRange: "127.77.0.0/24"})
	if err != nil {
		return 0, err
	}
	defer cp.Stop()
	e := &env{cp: cp}
	if e.admin, err = cp.RESTConfig(); err != nil {
		return 0, err
	}
	// Seeding creates over a thousand objects; client-go's default 5 QPS
	// would spend minutes in its own rate limiter.
	e.admin.QPS, e.admin.Burst = 1000, 2000
	start := time.Now()
	if err := seed(ctx, kubernetes.NewForConfigOrDie(e.admin), cp); err != nil {
		return 0, fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(os.Stderr, "e2e: control plane up and seeded in %s\n", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := e.startTier(ctx); err != nil {
		return 0, err
	}
	fmt.Fprintf(os.Stderr, "e2e: tier synced in %s\n", time.Since(start).Round(time.Millisecond))
	defer func() {
		e.cancelTier()
		<-e.tierDone
	}()
	testEnv = e
	return m.Run(), nil
}

// profile caches every resource the tests read.
func profile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
			{Version: "v1", Resource: "secrets"},
			{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}},
			{Version: "v1", Resource: "namespaces"},
			{Version: "v1", Resource: "events"},
			{Group: "example.cachetier.io", Version: "v1", Resource: "widgets"},
		},
	}
}

func (e *env) startTier(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ca, kp, err := pki.SelfSignedServing("tier", []string{"127.0.0.1"})
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		return err
	}
	tierCtx, cancel := context.WithCancel(ctx)
	e.cancelTier, e.tierDone = cancel, make(chan error, 1)
	log := funcr.New(func(p, a string) { fmt.Fprintln(os.Stderr, "tier:", p, a) }, funcr.Options{})
	go func() {
		e.tierDone <- standalone.Run(tierCtx, standalone.Config{
			ProfileName: profileName, Spec: profile(), Upstream: e.admin,
			Listener: ln, Certificate: cert, Log: log,
		})
	}()
	e.tierURL = "https://" + ln.Addr().String()
	e.tierAdmin = rest.CopyConfig(e.admin)
	e.tierAdmin.Host = e.tierURL
	e.tierAdmin.CAData = ca.CertPEM

	// A kubeconfig for kubectl against the tier, same admin identity.
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tier"] = &clientcmdapi.Cluster{Server: e.tierURL, CertificateAuthorityData: ca.CertPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: e.admin.CertData, ClientKeyData: e.admin.KeyData}
	cfg.Contexts["tier"] = &clientcmdapi.Context{Cluster: "tier", AuthInfo: "admin"}
	cfg.CurrentContext = "tier"
	e.tierKubeconfig = filepath.Join(e.cp.Dir, "kubeconfig-tier")
	if err := clientcmd.WriteToFile(*cfg, e.tierKubeconfig); err != nil {
		return err
	}
	// Ready when /readyz says every resource is synced.
	client, err := rest.HTTPClientFor(e.tierAdmin)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-e.tierDone:
			return fmt.Errorf("tier exited: %v", err)
		default:
		}
		resp, err := client.Get(e.tierURL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tier not ready after 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var _ = metav1.Now

// Package authedges sends the requests an attacker, a careless client or a
// broken network sends to the tier — forged front-proxy headers, expired
// and revoked ServiceAccount tokens, a RoleBinding removed mid-run,
// plaintext HTTP on the TLS port, a consistent read whose freshness cannot
// be proven — to real `cache-server` processes (standalone and a fleet's
// front, each directly and through the real aggregation layer) and the same
// requests to kube-apiserver, and compares the answers: status code, Status
// reason and message, and that no data comes back.
//
// One control plane serves every test: a standalone tier and a fleet (two
// shards, one front), each registered with an APIService and each reaching
// the apiserver through its own upstreamGate as its own ServiceAccount, so
// the apiserver's audit log tells the tiers' requests apart from the
// tests'.
package authedges

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/tierproc"
	"github.com/cachetier/cachetier/internal/pki"
)

const (
	// standaloneProfile and fleetProfile name the two tiers' profiles
	// (API groups <profile>.cache.cachetier.io).
	standaloneProfile = "edges"
	fleetProfile      = "edgesfleet"
	// tierNamespace holds the tiers' ServiceAccounts.
	tierNamespace = "cachetier-system"
	// dataNamespace holds what the tests read; otherNamespace what only
	// admins may read.
	dataNamespace  = "authedges"
	otherNamespace = "authedges-other"
	// configmapReader is the Role that lets its subjects read configmaps
	// in dataNamespace.
	configmapReader = "configmap-reader"
	// cachedCollection is the cluster-wide collection the tiers cache and
	// the gates hold the watches of.
	cachedCollection = "/api/v1/configmaps"
)

var (
	cp    *controlplane.ControlPlane
	admin *rest.Config
	kc    kubernetes.Interface
	// apiserver is the reference every target is compared with.
	apiserver target
	// targets are the tier as clients reach it.
	targets []target
	// gates stand between each tier and the apiserver (upstreamGate).
	gates []*upstreamGate
	// tierUsers are the tiers' identities at the apiserver.
	tierUsers = map[string]bool{}
	// standaloneTier and fleetTier are the processes.
	standaloneTier *tierproc.Tier
	fleetTier      *tierproc.Fleet
)

// target is one way to reach the tier (or the apiserver): base + an
// apiserver path (/api/v1/...) is the URL of the same read.
type target struct {
	name       string
	base       string
	roots      *x509.CertPool
	serverName string
	// aggregated: the apiserver authenticates the caller and authorizes
	// the aggregated path before the tier sees the request.
	aggregated bool
}

// auditPolicy records, at Metadata level, every request the tiers'
// ServiceAccounts send (the tests count them), their
// SubjectAccessReviews with the review asked (whose question it was), and
// nothing else.
//
// One event per request: a review's when its response is complete (the
// request's body is logged from that stage on), the others' when they
// arrive.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Request
  userGroups: ["system:serviceaccounts:` + tierNamespace + `"]
  resources: [{group: "authorization.k8s.io", resources: ["subjectaccessreviews"]}]
  omitStages: ["RequestReceived", "ResponseStarted", "Panic"]
- level: Metadata
  userGroups: ["system:serviceaccounts:` + tierNamespace + `"]
  omitStages: ["ResponseStarted", "ResponseComplete", "Panic"]
- level: None
`

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	binDir, err := os.MkdirTemp("", "cachetier-authedges-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	defer func() {
		// The tiers first (cp.Stop stops them before the apiserver): a
		// gate's Close waits for their connections.
		if cp != nil {
			_ = cp.Stop()
		}
		for _, g := range gates {
			g.Close()
		}
	}()
	if err := setUp(context.Background(), binDir); err != nil {
		fmt.Fprintln(os.Stderr, "authedges setup:", err)
		return 1
	}
	return m.Run()
}

// setUp starts the control plane, seeds it, and starts the tiers (built
// into binDir) behind their gates.
func setUp(ctx context.Context, binDir string) error {
	binary := filepath.Join(binDir, "cache-server")
	built := make(chan error, 1)
	go func() { built <- tierproc.Build(ctx, binary) }()

	var err error
	cp, err = controlplane.Start(ctx, controlplane.Options{ServiceClusterIPRange: "127.84.0.0/24", AuditPolicy: auditPolicy})
	if err != nil {
		<-built
		return err
	}
	if admin, err = cp.RESTConfig(); err != nil {
		<-built
		return err
	}
	kc = kubernetes.NewForConfigOrDie(admin)
	apiserver = target{name: "kube-apiserver", base: cp.URL, roots: pool(cp.ClusterCA.CertPEM)}
	if err := seed(ctx); err != nil {
		<-built
		return fmt.Errorf("seed: %w", err)
	}
	if err := <-built; err != nil {
		return err
	}

	standaloneKubeconfig, err := tierKubeconfig(ctx, "cachetier-"+standaloneProfile)
	if err != nil {
		return err
	}
	start := time.Now()
	standaloneTier, err = tierproc.Start(ctx, cp, tierproc.Options{
		Binary: binary, Profile: standaloneProfile, Spec: profile(), Kubeconfig: standaloneKubeconfig,
	})
	if err != nil {
		return fmt.Errorf("standalone tier: %w", err)
	}
	fmt.Fprintf(os.Stderr, "authedges: standalone tier registered in %s\n", time.Since(start).Round(time.Millisecond))
	fleetKubeconfig, err := tierKubeconfig(ctx, "cachetier-"+fleetProfile)
	if err != nil {
		return err
	}
	start = time.Now()
	fleetTier, err = tierproc.StartFleet(ctx, cp, tierproc.FleetOptions{
		Options: tierproc.Options{Binary: binary, Profile: fleetProfile, Spec: profile(), Kubeconfig: fleetKubeconfig, ServiceIPIndex: 51},
		Shards:  2,
	})
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	fmt.Fprintf(os.Stderr, "authedges: fleet (2 shards, 1 front) registered in %s\n", time.Since(start).Round(time.Millisecond))

	targets = []target{
		directTarget("standalone direct", standaloneTier),
		directTarget("fleet front direct", fleetTier.Tier),
		aggregatedTarget("standalone through the aggregator", standaloneTier),
		aggregatedTarget("fleet through the aggregator", fleetTier.Tier),
	}
	return nil
}

func directTarget(name string, t *tierproc.Tier) target {
	return target{name: name, base: t.DirectURL, roots: pool(t.DirectCA), serverName: t.ServerName}
}

func aggregatedTarget(name string, t *tierproc.Tier) target {
	return target{name: name, base: t.Paths.ServerURL(cp.URL), roots: pool(cp.ClusterCA.CertPEM), aggregated: true}
}

func pool(pemCerts []byte) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(pemCerts)
	return p
}

// profile caches configmaps, the resource every test reads.
func profile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources:  []v1alpha1.CachedResource{{Version: "v1", Resource: "configmaps"}},
	}
}

// seed creates the namespaces and configmaps the tests read, the Role
// that lets a subject read dataNamespace's configmaps, and lets every
// authenticated user use the tiers' aggregated paths (which the apiserver
// authorizes as the profile group's resources before proxying): what a
// user may read through the aggregator is then decided by the tier alone.
func seed(ctx context.Context) error {
	for _, ns := range []string{dataNamespace, otherNamespace, tierNamespace} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for _, ns := range []string{dataNamespace, otherNamespace} {
		for i := range 5 {
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: ns, Labels: map[string]string{"app": "edges"}},
				Data:       map[string]string{"secret-ish": fmt.Sprintf("value %d of %s", i, ns)},
			}
			if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	if _, err := kc.RbacV1().Roles(dataNamespace).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: configmapReader},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	groups := []string{standaloneProfile + ".cache.cachetier.io", fleetProfile + ".cache.cachetier.io"}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "cachetier-aggregated-paths"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: groups, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cachetier-aggregated-paths"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cachetier-aggregated-paths"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}, metav1.CreateOptions{})
	return err
}

// tierKubeconfig creates the ServiceAccount a tier runs as (cluster-admin:
// what the tier may read is not under test here), an upstreamGate for it,
// and a kubeconfig that reaches the apiserver through the gate with the
// account's token, as a pod's in-cluster configuration would.
func tierKubeconfig(ctx context.Context, name string) (string, error) {
	sa, err := kc.CoreV1().ServiceAccounts(tierNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: tierNamespace}},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	tr, err := kc.CoreV1().ServiceAccounts(tierNamespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	tierUsers["system:serviceaccount:"+tierNamespace+":"+name] = true
	g, err := newUpstreamGate(cp.URL, cp.ClusterCA.CertPEM, cachedCollection)
	if err != nil {
		return "", err
	}
	gates = append(gates, g)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gate"] = &clientcmdapi.Cluster{Server: g.URL(), CertificateAuthorityData: g.CAPEM()}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "gate", AuthInfo: name}
	cfg.CurrentContext = name
	path := filepath.Join(cp.Dir, "kubeconfig-"+name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

// credential is how a request authenticates: a client certificate, a
// bearer token, extra headers (forged front-proxy headers), or none.
type credential struct {
	cert    *tls.Certificate
	token   string
	headers http.Header
}

// clientCert issues a client certificate of the cluster's client CA for
// user in groups.
func clientCert(t *testing.T, user string, groups ...string) *tls.Certificate {
	t.Helper()
	return certFrom(t, cp.ClusterCA, user, groups...)
}

// certFrom issues a client certificate of ca: common name cn,
// organizations orgs.
func certFrom(t *testing.T, ca *pki.CA, cn string, orgs ...string) *tls.Certificate {
	t.Helper()
	kp, err := ca.IssueClient(cn, orgs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

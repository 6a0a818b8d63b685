package controlplane_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/cachetier/cachetier/internal/pki"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/hack/controlplane"
)

const (
	probeGroup   = "probe.cachetier.io"
	probeVersion = "v1alpha1"
)

// requestHeaderConfig is what the apiserver publishes in
// kube-system/extension-apiserver-authentication for aggregated servers.
type requestHeaderConfig struct {
	clientCA                                 *x509.CertPool
	allowedNames, userHdrs, groupHdrs, extra []string
}

func loadRequestHeaderConfig(t *testing.T, kc kubernetes.Interface) requestHeaderConfig {
	t.Helper()
	cm, err := kc.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read extension-apiserver-authentication: %v", err)
	}
	var c requestHeaderConfig
	c.clientCA = x509.NewCertPool()
	if !c.clientCA.AppendCertsFromPEM([]byte(cm.Data["requestheader-client-ca-file"])) {
		t.Fatalf("no request-header CA in configmap: %v", cm.Data)
	}
	for key, dst := range map[string]*[]string{
		"requestheader-allowed-names":        &c.allowedNames,
		"requestheader-username-headers":     &c.userHdrs,
		"requestheader-group-headers":        &c.groupHdrs,
		"requestheader-extra-headers-prefix": &c.extra,
	} {
		if err := json.Unmarshal([]byte(cm.Data[key]), dst); err != nil {
			t.Fatalf("configmap key %s: %v", key, err)
		}
	}
	return c
}

// seenUser is what the probe server recorded for an authenticated request.
type seenUser struct {
	Name   string   `json:"name"`
	Groups []string `json:"groups"`
}

// probeServer is a minimal aggregated API server: it authenticates the
// aggregator with k8s.io/apiserver's request-header authenticator (client
// certificate verified against the request-header CA, CN in the allowed
// names) and only then trusts the X-Remote-* headers.
type probeServer struct {
	authn headerrequestAuthenticator
	mu    sync.Mutex
	seen  []seenUser
}

type headerrequestAuthenticator interface {
	AuthenticateRequest(*http.Request) (*authResponse, bool, error)
}

func (s *probeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	resp, ok, err := s.authn.AuthenticateRequest(r)
	if err != nil || !ok {
		http.Error(w, fmt.Sprintf("unauthenticated: %v", err), http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/apis/" + probeGroup + "/" + probeVersion:
		_ = json.NewEncoder(w).Encode(metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: probeGroup + "/" + probeVersion,
			APIResources: []metav1.APIResource{{Name: "widgets", Kind: "Widget", Namespaced: false, Verbs: []string{"get", "list"}}},
		})
	case "/apis/" + probeGroup + "/" + probeVersion + "/widgets":
		u := seenUser{Name: resp.Name, Groups: resp.Groups}
		s.mu.Lock()
		s.seen = append(s.seen, u)
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(u)
	default:
		http.NotFound(w, r)
	}
}

func (s *probeServer) lastSeen() []seenUser {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenUser(nil), s.seen...)
}

// TestAggregationThroughRealAPIServer proves the local control plane's
// aggregation layer end to end: kubectl as a non-admin user reaches a server
// registered by APIService, and that server sees the caller's identity only
// after verifying the aggregator's client certificate.
func TestAggregationThroughRealAPIServer(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	rh := loadRequestHeaderConfig(t, kc)
	if len(rh.allowedNames) != 1 || rh.allowedNames[0] != controlplane.FrontProxyClientName {
		t.Fatalf("allowed names = %v", rh.allowedNames)
	}

	// Serving certificate for the Service DNS name the aggregator verifies.
	servingCA, err := pki.NewCA("probe-serving-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := servingCA.IssueServing("probe", []string{"probe.probe-system.svc"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}

	srv := &probeServer{authn: newAuthenticator(rh)}
	clusterIP := cp.ServiceIP(50)
	ln, err := net.Listen("tcp", net.JoinHostPort(clusterIP, "8443"))
	if err != nil {
		t.Fatalf("listen on ClusterIP %s: %v", clusterIP, err)
	}
	// RequestClientCert: the TLS layer asks for a certificate but leaves its
	// verification to the request-header authenticator, which knows the CA.
	httpSrv := &http.Server{Handler: srv, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}}
	go func() { _ = httpSrv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = httpSrv.Close() })

	if err := cp.RegisterAPIService(ctx, controlplane.APIServiceRegistration{
		Group: probeGroup, Version: probeVersion, Namespace: "probe-system", ServiceName: "probe",
		ClusterIP: clusterIP, Port: 8443, CABundle: servingCA.CertPEM,
	}); err != nil {
		t.Fatal(err)
	}

	// alice may list widgets; bob may not.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{probeGroup}, Resources: []string{"widgets"}, Verbs: []string{"get", "list"}}},
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-reader-devs"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "widget-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "devs"}},
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	path := "/apis/" + probeGroup + "/" + probeVersion + "/widgets"
	aliceCfg, err := cp.UserKubeconfig("alice", "devs")
	if err != nil {
		t.Fatal(err)
	}
	// RBAC caches are eventually consistent for a moment after the binding.
	var out []byte
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err = cp.RunKubectl(ctx, aliceCfg, "get", "--raw", path)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("kubectl get --raw as alice: %v", err)
	}
	var got seenUser
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if got.Name != "alice" || !contains(got.Groups, "devs") || !contains(got.Groups, "system:authenticated") {
		t.Fatalf("server saw %+v, want alice in groups devs and system:authenticated", got)
	}

	bobCfg, err := cp.UserKubeconfig("bob", "others")
	if err != nil {
		t.Fatal(err)
	}
	before := len(srv.lastSeen())
	out, err = cp.RunKubectl(ctx, bobCfg, "get", "--raw", path)
	if err == nil || !strings.Contains(string(out), "Forbidden") {
		t.Fatalf("bob without RBAC: err=%v out=%s; want Forbidden from the apiserver", err, out)
	}
	if n := len(srv.lastSeen()); n != before {
		t.Fatalf("a request denied by the apiserver reached the aggregated server")
	}

	t.Run("forged headers without the aggregator's certificate are rejected", func(t *testing.T) {
		direct := "https://" + net.JoinHostPort(clusterIP, "8443") + path
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(servingCA.CertPEM)
		// Certificates that must not be accepted as the aggregator:
		// none, one from the cluster CA, and one from the request-header CA
		// whose CN is not an allowed name.
		clusterSigned, err := cp.ClusterCA.IssueClient(controlplane.FrontProxyClientName, nil)
		if err != nil {
			t.Fatal(err)
		}
		wrongName, err := cp.FrontProxyCA.IssueClient("not-the-aggregator", nil)
		if err != nil {
			t.Fatal(err)
		}
		for name, kp := range map[string]*pki.KeyPair{
			"no client certificate":       nil,
			"certificate from another CA": &clusterSigned,
			"request-header CA, wrong CN": &wrongName,
		} {
			tlsCfg := &tls.Config{RootCAs: roots, ServerName: "probe.probe-system.svc"}
			if kp != nil {
				c, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
				if err != nil {
					t.Fatal(err)
				}
				tlsCfg.Certificates = []tls.Certificate{c}
			}
			client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 10 * time.Second}
			req, _ := http.NewRequest(http.MethodGet, direct, nil)
			req.Header.Set("X-Remote-User", "system:admin")
			req.Header.Add("X-Remote-Group", "system:masters")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
			}
		}
		for _, u := range srv.lastSeen() {
			if u.Name == "system:admin" {
				t.Fatalf("forged identity was accepted: %+v", u)
			}
		}
	})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

type authResponse struct {
	Name   string
	Groups []string
}

type authenticatorFunc func(*http.Request) (*authResponse, bool, error)

func (f authenticatorFunc) AuthenticateRequest(r *http.Request) (*authResponse, bool, error) {
	return f(r)
}

// newAuthenticator wires k8s.io/apiserver's request-header authenticator with
// the configuration the apiserver published.
func newAuthenticator(rh requestHeaderConfig) headerrequestAuthenticator {
	verify := func() (x509.VerifyOptions, bool) {
		opts := x509request.DefaultVerifyOptions()
		opts.Roots = rh.clientCA
		return opts, true
	}
	a := headerrequest.NewDynamicVerifyOptionsSecure(verify,
		headerrequest.StaticStringSlice(rh.allowedNames),
		headerrequest.StaticStringSlice(rh.userHdrs),
		headerrequest.StaticStringSlice(nil),
		headerrequest.StaticStringSlice(rh.groupHdrs),
		headerrequest.StaticStringSlice(rh.extra))
	return authenticatorFunc(func(r *http.Request) (*authResponse, bool, error) {
		resp, ok, err := a.AuthenticateRequest(r)
		if err != nil || !ok {
			return nil, ok, err
		}
		return &authResponse{Name: resp.User.GetName(), Groups: resp.User.GetGroups()}, true, nil
	})
}

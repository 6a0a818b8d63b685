package fleet

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/internal/pki"
)

func endpoint(host, addr string, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Hostname: ptr.To(host), Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Terminating: ptr.To(terminating)}}
}

// TestReplicaAddressesFromSlices: each endpoint's hostname (a StatefulSet
// pod's name) maps to its address; a terminating endpoint yields to a live
// one of the same name whichever slice comes first; endpoints without a
// hostname or an address are no replicas.
func TestReplicaAddressesFromSlices(t *testing.T) {
	slices := []*discoveryv1.EndpointSlice{
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
			endpoint("shard-0-0", "100.64.1.5", false), endpoint("shard-0-1", "100.64.2.9", true),
			{Addresses: []string{"100.64.3.3"}}, {Hostname: ptr.To("empty")},
		}},
		{AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
			endpoint("shard-0-1", "100.64.3.4", false), endpoint("shard-0-0", "100.64.9.9", true),
		}},
		{AddressType: discoveryv1.AddressTypeFQDN, Endpoints: []discoveryv1.Endpoint{endpoint("shard-1-0", "x.example", false)}},
	}
	got := replicaAddresses(slices)
	want := map[string]string{"shard-0-0": "100.64.1.5", "shard-0-1": "100.64.3.4"}
	if !equalMaps(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestReplicaAddressesFollowEndpointSlices: against a real apiserver, the
// addresses follow the EndpointSlices of the one Service as they change,
// and names of another Service or namespace are not answered (they go to
// DNS).
func TestReplicaAddressesFollowEndpointSlices(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	cfg, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	const ns = "fleet-ns"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := func(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
		}
	}
	es := kc.DiscoveryV1().EndpointSlices(ns)
	mine, err := es.Create(ctx, slice("fleet-shards-a", "fleet-shards", endpoint("fleet-shard-0-0", "100.64.1.5", false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := es.Create(ctx, slice("other-a", "other", endpoint("fleet-shard-0-1", "100.64.7.7", false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := WatchReplicaAddresses(ctx, kc, ns, "fleet-shards", logr.Discard())
	wait := func(host, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, ok := a.Lookup(host)
			if (want == "" && !ok) || (ok && got == want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Lookup(%s) = %q, %v; want %q", host, got, ok, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("fleet-shard-0-0.fleet-shards.fleet-ns.svc", "100.64.1.5")
	// The replica is replaced: a new pod, a new address.
	mine.Endpoints = []discoveryv1.Endpoint{endpoint("fleet-shard-0-0", "100.64.2.8", false), endpoint("fleet-shard-0-1", "100.64.3.9", false)}
	if _, err := es.Update(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("fleet-shard-0-0.fleet-shards.fleet-ns.svc", "100.64.2.8")
	wait("fleet-shard-0-1.fleet-shards.fleet-ns.svc", "100.64.3.9")
	for _, host := range []string{"fleet-shard-0-1.other.fleet-ns.svc", "fleet-shard-0-0.fleet-shards.default.svc", "fleet-shards.fleet-ns.svc", "x.fleet-shard-0-0.fleet-shards.fleet-ns.svc", "127.0.0.1"} {
		if got, ok := a.Lookup(host); ok {
			t.Errorf("Lookup(%s) = %s, want nothing (DNS)", host, got)
		}
	}
	if err := es.Delete(ctx, mine.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("fleet-shard-0-0.fleet-shards.fleet-ns.svc", "")
}

// TestHTTPClientDialsTheResolvedAddress: a replica's name resolved by the
// addresses is dialled at that address, and its certificate is still
// verified against the name (a certificate for another name is refused).
func TestHTTPClientDialsTheResolvedAddress(t *testing.T) {
	ca, err := pki.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	const name = "fleet-shard-0-0.fleet-shards.fleet-ns.svc"
	serve := func(dnsName string) string {
		kp, err := ca.IssueServing("shard", []string{dnsName}, nil)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		return port
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(host string) (string, bool) { return "127.0.0.1", host == name }
	client, err := NewHTTPClient(&rest.Config{}, caFile, resolve)
	if err != nil {
		t.Fatal(err)
	}
	port := serve(name)
	resp, err := client.Get(fmt.Sprintf("https://%s:%s/", name, port))
	if err != nil {
		t.Fatalf("dialling the resolved address: %v", err)
	}
	resp.Body.Close()
	other := serve("fleet-shard-0-1.fleet-shards.fleet-ns.svc")
	if resp, err := client.Get(fmt.Sprintf("https://%s:%s/", name, other)); err == nil {
		resp.Body.Close()
		t.Fatal("a certificate for another replica's name was accepted")
	}
}

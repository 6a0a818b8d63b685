package controllers

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"net"
	"testing"
	"time"
)

func verifyServing(t *testing.T, c Certificates, name string, at time.Time) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.CABundle()) {
		t.Fatal("CA bundle does not parse")
	}
	leaf, err := parseCert(c.ServingCertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("serving certificate does not verify for %s: %v", name, err)
	}
}

func TestEnsureCertificatesLifecycle(t *testing.T) {
	names := ServingDNSNames(testProfile(), testOpts)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	c1, plan, err := EnsureCertificates(rand.Reader, t0, Certificates{}, names)
	if err != nil || !plan.NewCA || !plan.NewServing {
		t.Fatalf("first issue: %+v %v", plan, err)
	}
	verifyServing(t, c1, "fleet-front.cachetier-system.svc", t0)
	// The fronts dial shard replicas by the names in the topology.
	for _, s := range BuildTopology(testProfile(), testOpts).Shards {
		for _, ep := range s.Endpoints {
			host, _, err := net.SplitHostPort(ep)
			if err != nil {
				t.Fatal(err)
			}
			verifyServing(t, c1, host, t0)
		}
	}

	// Unchanged inside the validity window: nothing is regenerated.
	c2, plan, err := EnsureCertificates(rand.Reader, t0.Add(30*24*time.Hour), c1, names)
	if err != nil || plan.NewCA || plan.NewServing || !sameCertificates(c1, c2) {
		t.Fatalf("unexpected renewal: %+v %v", plan, err)
	}
	if want := t0.Add(-backdate).Add(ServingLifetime + backdate - (ServingLifetime+backdate)/3); !plan.NextRenewal.Equal(want) {
		t.Errorf("NextRenewal = %s, want %s", plan.NextRenewal, want)
	}

	// In the serving renewal window: a new serving cert from the same CA.
	at := t0.Add(ServingLifetime - 20*24*time.Hour)
	c3, plan, err := EnsureCertificates(rand.Reader, at, c1, names)
	if err != nil || plan.NewCA || !plan.NewServing || !bytes.Equal(c3.CACertPEM, c1.CACertPEM) || bytes.Equal(c3.ServingCertPEM, c1.ServingCertPEM) {
		t.Fatalf("serving rotation: %+v %v", plan, err)
	}
	verifyServing(t, c3, "fleet-front.cachetier-system.svc", at)

	// Names changed (e.g. another namespace): reissued.
	other := ServingDNSNames(testProfile(), Options{Namespace: "elsewhere"})
	c4, plan, err := EnsureCertificates(rand.Reader, t0, c1, other)
	if err != nil || !plan.NewServing || plan.NewCA {
		t.Fatalf("names change: %+v %v", plan, err)
	}
	verifyServing(t, c4, "fleet-front.elsewhere.svc", t0)

	// In the CA renewal window: new CA, the old one still trusted.
	at = t0.Add(CALifetime - 100*24*time.Hour)
	c5, plan, err := EnsureCertificates(rand.Reader, at, c3, names)
	if err != nil || !plan.NewCA || !plan.NewServing || !bytes.Equal(c5.PreviousCACertPEM, c3.CACertPEM) {
		t.Fatalf("CA rotation: %+v %v", plan, err)
	}
	verifyServing(t, c5, "fleet-front.cachetier-system.svc", at)
	if !bytes.Contains(c5.CABundle(), c3.CACertPEM) || !bytes.Contains(c5.CABundle(), c5.CACertPEM) {
		t.Error("bundle must hold both CAs during rotation")
	}
	// Old serving cert (from the old CA) still verifies against the bundle.
	old := c5
	old.ServingCertPEM = c3.ServingCertPEM
	verifyServing(t, old, "fleet-front.cachetier-system.svc", t0.Add(ServingLifetime-19*24*time.Hour))

	// Once the previous CA has expired it is dropped from the bundle.
	c6, plan, err := EnsureCertificates(rand.Reader, t0.Add(CALifetime+time.Hour), c5, names)
	if err != nil || plan.NewCA || len(c6.PreviousCACertPEM) != 0 {
		t.Fatalf("previous CA not dropped: %+v %v", plan, err)
	}

	// Garbage is replaced, not trusted.
	bad := c1
	bad.CAKeyPEM = []byte("garbage")
	if _, plan, err := EnsureCertificates(rand.Reader, t0, bad, names); err != nil || !plan.NewCA {
		t.Fatalf("unreadable CA key not replaced: %+v %v", plan, err)
	}
	foreign, _, _ := EnsureCertificates(rand.Reader, t0, Certificates{}, names)
	mixed := c1
	mixed.ServingCertPEM, mixed.ServingKeyPEM = foreign.ServingCertPEM, foreign.ServingKeyPEM
	if _, plan, err := EnsureCertificates(rand.Reader, t0, mixed, names); err != nil || plan.NewCA || !plan.NewServing {
		t.Fatalf("serving cert of another CA kept: %+v %v", plan, err)
	}
}

// The serving Secret is what fronts and shards mount: its ca.crt (the
// --shard-ca-file) verifies the certificate the shards serve.
func TestServingSecretCAVerifiesShards(t *testing.T) {
	p := testProfile()
	c := testCerts(t, p)
	data := BuildServingSecret(p, testOpts, c).Data
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[TLSCAKey]) {
		t.Fatalf("serving secret has no CA in %s", TLSCAKey)
	}
	leaf, err := parseCert(data["tls.crt"])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"fleet-shard-0-1.fleet-shards.cachetier-system.svc", "fleet-front.cachetier-system.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The wildcard covers one label: replicas of this fleet only.
	for _, name := range []string{"fleet-shards.cachetier-system.svc", "a.b.fleet-shards.cachetier-system.svc", "x.other-shards.cachetier-system.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err == nil {
			t.Errorf("%s verifies", name)
		}
	}
}

func TestCertificatesRoundTripThroughSecrets(t *testing.T) {
	p := testProfile()
	c := testCerts(t, p)
	c.PreviousCACertPEM = []byte("prev")
	back := certificatesFromSecrets(BuildCASecret(p, testOpts, c).Data, BuildServingSecret(p, testOpts, c).Data)
	if !sameCertificates(c, back) {
		t.Fatal("secrets do not round-trip the certificates")
	}
}

// sameCertificates says whether EnsureCertificates changed anything.
func sameCertificates(a, b Certificates) bool {
	return bytes.Equal(a.CACertPEM, b.CACertPEM) && bytes.Equal(a.CAKeyPEM, b.CAKeyPEM) &&
		bytes.Equal(a.PreviousCACertPEM, b.PreviousCACertPEM) &&
		bytes.Equal(a.ServingCertPEM, b.ServingCertPEM) && bytes.Equal(a.ServingKeyPEM, b.ServingKeyPEM)
}

// Package pki generates the short-lived certificate authorities and
// certificates cachetier needs on its own: the local control plane's cluster
// and front-proxy CAs, and self-signed serving certificates.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority generated for one control plane. Everything
// is generated fresh per start so nothing secret is ever committed or reused.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// KeyPair is a PEM-encoded certificate and private key.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA creates a self-signed CA valid for a day: long enough for any test or
// demo session, short enough that a leaked one is worthless.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// KeyPEM encodes the CA's private key, for a component that signs with it
// (kube-controller-manager's CSR signer).
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// IssueClient signs a client certificate; organizations become the user's
// groups in Kubernetes' x509 authenticator.
func (ca *CA) IssueClient(commonName string, organizations []string) (KeyPair, error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName, Organization: organizations},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// IssueServing signs a serving certificate for the given DNS names and IPs.
func (ca *CA) IssueServing(commonName string, dnsNames []string, ips []net.IP) (KeyPair, error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: commonName},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

func (ca *CA) issue(tmpl *x509.Certificate) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return KeyPair{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// WriteFiles writes the pair as <base>.crt and <base>.key (0600).
func (kp KeyPair) WriteFiles(base string) (certFile, keyFile string, err error) {
	certFile, keyFile = base+".crt", base+".key"
	if err := os.WriteFile(certFile, kp.CertPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, kp.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// NewServiceAccountKey returns a PEM private key for signing service account
// tokens; the apiserver derives the verification key from the same file.
func NewServiceAccountKey() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal service account key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		// crypto/rand never fails on Linux; a fixed serial would still be valid.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// SelfSignedServing creates a CA and a serving certificate for hosts (DNS
// names or IPs) signed by it. The CA is what clients (or an APIService's
// caBundle) trust.
func SelfSignedServing(commonName string, hosts []string) (*CA, KeyPair, error) {
	ca, err := NewCA(commonName + "-ca")
	if err != nil {
		return nil, KeyPair{}, err
	}
	var dns []string
	var ips []net.IP
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	kp, err := ca.IssueServing(commonName, dns, ips)
	return ca, kp, err
}

// ServingFiles is a CA and a serving certificate written to a directory.
type ServingFiles struct {
	CAPEM                     []byte
	CAFile, CertFile, KeyFile string
}

// WriteServingFiles creates a CA and a serving certificate for dnsNames and
// ips signed by it, and writes ca.crt, tls.crt and tls.key into dir: the
// shape of the operator's serving Secret, for local fleets.
func WriteServingFiles(dir, commonName string, dnsNames []string, ips []net.IP) (ServingFiles, error) {
	ca, err := NewCA(commonName)
	if err != nil {
		return ServingFiles{}, err
	}
	kp, err := ca.IssueServing(commonName, dnsNames, ips)
	if err != nil {
		return ServingFiles{}, err
	}
	f := ServingFiles{CAPEM: ca.CertPEM, CAFile: filepath.Join(dir, "ca.crt")}
	if f.CertFile, f.KeyFile, err = kp.WriteFiles(filepath.Join(dir, "tls")); err != nil {
		return ServingFiles{}, err
	}
	return f, os.WriteFile(f.CAFile, ca.CertPEM, 0o600)
}

// Package servingcert provides the cache-server's serving certificate when
// none is configured: a fresh CA and a certificate for the given hosts,
// written to a directory so clients (or an APIService caBundle) can trust
// the CA.
package servingcert

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"

	"github.com/cachetier/cachetier/internal/pki"
)

// SelfSigned generates a CA-signed serving certificate for the
// comma-separated hosts. When dir is not empty it writes ca.crt, tls.crt and
// tls.key there.
func SelfSigned(dir, hosts string) (tls.Certificate, error) {
	ca, kp, err := pki.SelfSignedServing("cachetier-cache-server", strings.Split(hosts, ","))
	if err != nil {
		return tls.Certificate{}, err
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return tls.Certificate{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600); err != nil {
			return tls.Certificate{}, err
		}
		if _, _, err := kp.WriteFiles(filepath.Join(dir, "tls")); err != nil {
			return tls.Certificate{}, err
		}
	}
	return tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
}

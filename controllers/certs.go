package controllers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"time"
)

// Certificate lifetimes. Rotation starts when a third of the lifetime is
// left, so a failing operator has weeks (serving) or months (CA) to be fixed
// before anything expires.
const (
	CALifetime      = 2 * 365 * 24 * time.Hour
	ServingLifetime = 90 * 24 * time.Hour
	// backdate absorbs clock skew between the operator and the apiserver.
	backdate = 5 * time.Minute
)

func renewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotAfter.Add(-life / 3)
}

// CertPlan is what EnsureCertificates decided, for events and requeueing.
type CertPlan struct {
	NewCA      bool
	NewServing bool
	Reason     string
	// NextRenewal is when the earliest certificate enters its renewal window.
	NextRenewal time.Time
}

// EnsureCertificates keeps the current material when it is valid, signed by
// the current CA, for the right names and not in its renewal window, and
// generates what is missing or due otherwise. The clock is a parameter, so
// rotation is unit-tested by moving "now" instead of waiting.
func EnsureCertificates(rand io.Reader, now time.Time, current Certificates, dnsNames []string) (Certificates, CertPlan, error) {
	out := current
	var plan CertPlan

	ca, caErr := parseCert(current.CACertPEM)
	if caErr == nil {
		_, caErr = parseKey(current.CAKeyPEM)
	}
	switch {
	case len(current.CACertPEM) == 0:
		plan.NewCA, plan.Reason = true, "no CA yet"
	case caErr != nil:
		plan.NewCA, plan.Reason = true, "CA unreadable: "+caErr.Error()
	case !now.Before(renewAt(ca)):
		plan.NewCA, plan.Reason = true, fmt.Sprintf("CA expires %s", ca.NotAfter.Format(time.RFC3339))
	}
	if plan.NewCA {
		certPEM, keyPEM, err := newCA(rand, now)
		if err != nil {
			return current, plan, err
		}
		// Keep trusting the old CA while it is valid: fronts still present
		// certificates it signed until they restart with the new one.
		out.PreviousCACertPEM = nil
		if caErr == nil && now.Before(ca.NotAfter) {
			out.PreviousCACertPEM = current.CACertPEM
		}
		out.CACertPEM, out.CAKeyPEM = certPEM, keyPEM
		ca, _ = parseCert(certPEM)
	} else if prev, err := parseCert(current.PreviousCACertPEM); len(current.PreviousCACertPEM) > 0 && (err != nil || !now.Before(prev.NotAfter)) {
		out.PreviousCACertPEM = nil
		plan.Reason = "previous CA expired"
	}

	serving, err := parseCert(current.ServingCertPEM)
	if err == nil {
		_, err = parseKey(current.ServingKeyPEM)
	}
	switch {
	case plan.NewCA:
		plan.NewServing = true
	case err != nil:
		plan.NewServing, plan.Reason = true, "serving certificate missing or unreadable"
	case serving.CheckSignatureFrom(ca) != nil:
		plan.NewServing, plan.Reason = true, "serving certificate not signed by the current CA"
	case !slices.Equal(sortedCopy(serving.DNSNames), sortedCopy(dnsNames)):
		plan.NewServing, plan.Reason = true, "serving certificate names changed"
	case !now.Before(renewAt(serving)):
		plan.NewServing, plan.Reason = true, fmt.Sprintf("serving certificate expires %s", serving.NotAfter.Format(time.RFC3339))
	}
	if plan.NewServing {
		caKey, err := parseKey(out.CAKeyPEM)
		if err != nil {
			return current, plan, err
		}
		out.ServingCertPEM, out.ServingKeyPEM, err = newServing(rand, now, ca, caKey, dnsNames)
		if err != nil {
			return current, plan, err
		}
		serving, _ = parseCert(out.ServingCertPEM)
	}
	plan.NextRenewal = renewAt(ca)
	if r := renewAt(serving); r.Before(plan.NextRenewal) {
		plan.NextRenewal = r
	}
	return out, plan, nil
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

func serial(rand io.Reader) (*big.Int, error) {
	return randInt(rand, new(big.Int).Lsh(big.NewInt(1), 127))
}

func randInt(rand io.Reader, max *big.Int) (*big.Int, error) {
	b := make([]byte, (max.BitLen()+7)/8)
	if _, err := io.ReadFull(rand, b); err != nil {
		return nil, err
	}
	return new(big.Int).Mod(new(big.Int).SetBytes(b), max), nil
}

func newCA(rand io.Reader, now time.Time) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial(rand)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("cachetier-ca@%d", now.Unix())},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	return encode(der, key)
}

func newServing(rand io.Reader, now time.Time, ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsNames []string) ([]byte, []byte, error) {
	if len(dnsNames) == 0 {
		return nil, nil, errors.New("serving certificate needs at least one DNS name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial(rand)
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(ServingLifetime)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	return encode(der, key)
}

func encode(der []byte, key *ecdsa.PrivateKey) ([]byte, []byte, error) {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func parseKey(p []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "EC PRIVATE KEY" {
		return nil, errors.New("no PEM EC private key")
	}
	return x509.ParseECPrivateKey(b.Bytes)
}

// certificatesFromSecrets reads material back from the two Secrets (either
// may be missing); the inverse of BuildCASecret/BuildServingSecret.
func certificatesFromSecrets(ca, serving map[string][]byte) Certificates {
	c := Certificates{CACertPEM: ca["ca.crt"], CAKeyPEM: ca["ca.key"], PreviousCACertPEM: ca["ca-previous.crt"]}
	c.ServingCertPEM, c.ServingKeyPEM = serving["tls.crt"], serving["tls.key"]
	return c
}

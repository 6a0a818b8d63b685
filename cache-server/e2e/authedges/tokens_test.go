package authedges

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestServiceAccountTokens sends ServiceAccount tokens the apiserver no
// longer accepts — expired, bound to a Secret that was deleted, of a
// ServiceAccount that was deleted — to the tier, which checks them by
// TokenReview, and compares each answer with the apiserver's.
func TestServiceAccountTokens(t *testing.T) {
	ctx := context.Background()
	path := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	const account = "token-reader"
	newServiceAccount(t, account)
	valid := requestToken(t, account, nil)

	everyTargetServes := func(t *testing.T, token string) {
		t.Helper()
		cred := credential{token: token}
		want := apiserver.send(t, cred, path)
		for _, tg := range targets {
			sameList(t, tg, tg.send(t, cred, path), want)
		}
	}
	everyTargetRefuses := func(t *testing.T, token string) {
		t.Helper()
		cred := credential{token: token}
		want := apiserver.send(t, cred, path)
		t.Logf("kube-apiserver: %s", want)
		for _, tg := range targets {
			got := tg.send(t, cred, path)
			t.Logf("%s: %s", tg.name, got)
			sameRefusal(t, tg, got, want)
		}
	}

	t.Run("control: a valid token", func(t *testing.T) {
		everyTargetServes(t, valid)
	})
	// The expired token below is the apiserver's own token re-signed with
	// its key; the same token re-signed with its claims unchanged must
	// still be accepted, or the expired case would prove nothing.
	t.Run("control: the token re-signed unchanged", func(t *testing.T) {
		resigned := resign(t, valid, func(map[string]any) {})
		if resigned == valid {
			t.Fatal("re-signing reproduced the token byte for byte: ECDSA signatures are randomized")
		}
		reviewToken(t, resigned, "")
		everyTargetServes(t, resigned)
	})
	// TokenRequest refuses expirationSeconds under 600 ("may not specify a
	// duration less than 10 minutes"), kube-apiserver refuses
	// --service-account-max-token-expiration under 1 h, and token
	// validation allows 60 s of clock skew (go-jose's DefaultLeeway): a
	// token the apiserver issued expires 11 minutes after issue at the
	// earliest. Instead of waiting, the test moves the token's times back
	// by its lifetime plus two minutes and signs it with the cluster's
	// service-account key: the token the apiserver would have issued
	// that long ago.
	t.Run("expired", func(t *testing.T) {
		expired := resign(t, valid, func(claims map[string]any) {
			exp, iat := claimTime(t, claims, "exp"), claimTime(t, claims, "iat")
			back := exp - iat + 120
			for _, c := range []string{"exp", "iat", "nbf"} {
				claims[c] = claimTime(t, claims, c) - back
			}
		})
		reviewToken(t, expired, "service account token has expired")
		everyTargetRefuses(t, expired)
	})
	t.Run("bound Secret deleted", func(t *testing.T) {
		secret, err := kc.CoreV1().Secrets(dataNamespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token-binding"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ref := &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: secret.Name, UID: secret.UID}
		readers := tokenReaders(t, func() string { return requestToken(t, account, ref) })
		got := untilRefused(t, readers, path, func() {
			if err := kc.CoreV1().Secrets(dataNamespace).Delete(ctx, secret.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		})
		reviewToken(t, readers[0].cred.token, "service account token has been invalidated")
		refusedInTime(t, readers, got, path)
	})
	t.Run("ServiceAccount deleted", func(t *testing.T) {
		const doomed = "doomed"
		newServiceAccount(t, doomed)
		readers := tokenReaders(t, func() string { return requestToken(t, doomed, nil) })
		got := untilRefused(t, readers, path, func() {
			if err := kc.CoreV1().ServiceAccounts(dataNamespace).Delete(ctx, doomed, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		})
		reviewToken(t, readers[0].cred.token, `serviceaccounts "doomed" not found`)
		refusedInTime(t, readers, got, path)
	})
}

// tokenReaders is a reader for the apiserver and each target, each with
// its own token (so no reader's cached answer serves another).
func tokenReaders(t *testing.T, token func() string) []reader {
	t.Helper()
	var readers []reader
	for _, tg := range append([]target{apiserver}, targets...) {
		readers = append(readers, reader{tg: tg, cred: credential{token: token()}})
	}
	return readers
}

// newServiceAccount creates a ServiceAccount in dataNamespace that may
// read its configmaps.
func newServiceAccount(t *testing.T, name string) {
	t.Helper()
	if _, err := kc.CoreV1().ServiceAccounts(dataNamespace).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind(t, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: dataNamespace})
}

// requestToken asks the apiserver for a one-hour token of account,
// bound to ref when it is not nil.
func requestToken(t *testing.T, account string, ref *authenticationv1.BoundObjectReference) string {
	t.Helper()
	tr, err := kc.CoreV1().ServiceAccounts(dataNamespace).CreateToken(context.Background(), account, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: ref},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// reviewToken asks the apiserver what it makes of token: authenticated
// when wantError is empty, else refused with an error containing it.
func reviewToken(t *testing.T, token, wantError string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr, err := kc.AuthenticationV1().TokenReviews().Create(context.Background(), &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ok := tr.Status.Authenticated && wantError == "" || !tr.Status.Authenticated && wantError != "" && strings.Contains(tr.Status.Error, wantError)
		if ok {
			t.Logf("the apiserver's TokenReview: authenticated=%v error=%q", tr.Status.Authenticated, tr.Status.Error)
			return
		}
		// kube-apiserver keeps successful token authentications for 10 s
		// itself (its authenticator's TokenSuccessCacheTTL).
		if time.Now().After(deadline) {
			t.Fatalf("TokenReview: authenticated=%v error=%q; want error %q", tr.Status.Authenticated, tr.Status.Error, wantError)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// resign returns token with its claims changed by edit, signed with the
// control plane's service-account signing key (ES256, the header — with
// its key ID — unchanged).
func resign(t *testing.T, token string, edit func(claims map[string]any)) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS compact serialization: %d parts", len(parts))
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg != "ES256" {
		t.Fatalf("token header: alg %q, %v; want ES256 (pki.NewServiceAccountKey)", header.Alg, err)
	}
	claims := map[string]any{}
	if err := decodeSegment(parts[1], &claims); err != nil {
		t.Fatal(err)
	}
	edit(claims)
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signingInput := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	keyPEM, err := os.ReadFile(cp.PKI.ServiceAccountKey)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		t.Fatalf("%s: no PEM block", cp.PKI.ServiceAccountKey)
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte(signingInput))
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	// JWS ES256: R and S as 32-byte big-endian integers (RFC 7518 3.4).
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signingInput + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func decodeSegment(seg string, v any) error {
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	return d.Decode(v)
}

// claimTime is a NumericDate claim in seconds.
func claimTime(t *testing.T, claims map[string]any, name string) int64 {
	t.Helper()
	switch v := claims[name].(type) {
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		return n
	case int64:
		return v
	}
	t.Fatalf("claim %s: %T %v", name, claims[name], claims[name])
	return 0
}

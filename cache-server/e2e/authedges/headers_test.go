package authedges

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// TestForgedRequestHeaders sends the aggregator's identity headers
// (X-Remote-User/-Uid/-Group/-Extra-*, claiming a system:masters user)
// straight to the tier with every kind of client certificate that is not
// the aggregator's, and compares each answer with kube-apiserver's answer
// to the same request. A control case with the aggregator's own
// certificate shows the headers are honoured when they should be — and so
// that the other cases would have read everything had they been.
func TestForgedRequestHeaders(t *testing.T) {
	forged := http.Header{
		"X-Remote-User":         {"forged-admin"},
		"X-Remote-Uid":          {"forged-uid"},
		"X-Remote-Group":        {"system:masters"},
		"X-Remote-Extra-Scopes": {"everything"},
	}
	reader := clientCert(t, "reader", "edges-readers")
	bindReader(t, "reader")
	paths := []string{
		"/api/v1/namespaces/" + dataNamespace + "/configmaps",
		"/api/v1/namespaces/" + otherNamespace + "/configmaps/cm-0",
		"/api/v1/configmaps",
	}
	// What each certificate must get, whatever the headers say.
	const (
		refused  = iota // every read refused
		asReader        // dataNamespace readable, the rest 403 for "reader"
		asForged        // everything readable (the control)
	)
	for _, c := range []struct {
		name string
		cert *tls.Certificate
		want int
	}{
		{"no client certificate", nil, refused},
		{"client certificate of the cluster's client CA", reader, asReader},
		{"request-header CA certificate whose name is not allowed", certFrom(t, cp.FrontProxyCA, "not-the-aggregator"), refused},
		{"control: the aggregator's certificate", certFrom(t, cp.FrontProxyCA, controlplane.FrontProxyClientName), asForged},
	} {
		t.Run(c.name, func(t *testing.T) {
			cred := credential{cert: c.cert, headers: forged}
			for _, path := range paths {
				want := apiserver.send(t, cred, path)
				t.Logf("kube-apiserver: GET %s -> %s", path, want)
				for _, tg := range append([]target{apiserver}, targets...) {
					got := want
					if tg.name != apiserver.name {
						got = tg.send(t, cred, path)
						t.Logf("%s: GET %s -> %s", tg.name, path, got)
					}
					switch {
					case c.want == refused || c.want == asReader && path != paths[0]:
						if got.code < 400 {
							t.Fatalf("%s served %s with forged headers", tg.name, path)
						}
						noData(t, tg, got)
						if c.want == asReader && (got.status == nil || !strings.Contains(got.status.Message, `User "reader"`)) {
							t.Fatalf("%s: %s; want a refusal of the certificate's user", tg.name, got)
						}
					case got.code != http.StatusOK:
						t.Fatalf("%s: %s; want the read served", tg.name, got)
					}
					if tg.name == apiserver.name {
						continue
					}
					if c.cert == nil && !tg.aggregated {
						anonymousRefused(t, tg, got, want)
						continue
					}
					if want.code == http.StatusOK {
						sameList(t, tg, got, want)
					} else {
						sameRefusal(t, tg, got, want)
					}
				}
			}
		})
	}
}

// anonymousRefused checks a deliberate difference (docs/differences.md):
// kube-apiserver (--anonymous-auth defaults to true) takes a request
// without credentials for system:anonymous and refuses it by RBAC with 403;
// the tier does not authenticate anonymous requests and answers 401,
// because it cannot know whether its apiserver allows them — with
// anonymous requests on, it would serve whatever RBAC grants
// system:anonymous even where the apiserver refuses them.
func anonymousRefused(t *testing.T, tg target, got, want answer) {
	t.Helper()
	if want.code != http.StatusForbidden || want.status == nil || !strings.Contains(want.status.Message, `User "system:anonymous"`) {
		t.Fatalf("the apiserver answered %s; docs/differences.md says 403 for system:anonymous", want)
	}
	if got.code != http.StatusUnauthorized || got.status == nil || got.status.Reason != metav1.StatusReasonUnauthorized || got.status.Message != "Unauthorized" {
		t.Fatalf("%s answered %s; want 401 Unauthorized (docs/differences.md)", tg.name, got)
	}
	noData(t, tg, got)
}

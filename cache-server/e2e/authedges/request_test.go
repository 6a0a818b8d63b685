package authedges

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// answer is what a target answered to one request.
type answer struct {
	code   int
	header http.Header
	body   []byte
	// status is the body as a metav1.Status when it is one.
	status *metav1.Status
}

func (a answer) String() string {
	if a.status != nil {
		s := fmt.Sprintf("%d %s %q", a.code, a.status.Reason, a.status.Message)
		if d := a.status.Details; d != nil && (len(d.Causes) > 0 || d.RetryAfterSeconds > 0) {
			s += fmt.Sprintf(" causes=%v retryAfterSeconds=%d", d.Causes, d.RetryAfterSeconds)
		}
		return s
	}
	body := string(a.body)
	if len(body) > 300 {
		body = body[:300] + "…"
	}
	return fmt.Sprintf("%d %q", a.code, body)
}

// client is an HTTP/2 client of tg with cred's certificate (if any), as
// client-go builds one.
func (tg target) client(cred credential) *http.Client {
	cfg := &tls.Config{RootCAs: tg.roots, ServerName: tg.serverName, MinVersion: tls.VersionTLS12}
	if cred.cert != nil {
		cfg.Certificates = []tls.Certificate{*cred.cert}
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

// get sends GET base+path with cred over c.
func (tg target) get(ctx context.Context, c *http.Client, cred credential, path string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.base+path, nil)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Accept", "application/json")
	for k, vv := range cred.headers {
		for _, v := range vv {
			req.Header.Add(k, v)
		}
	}
	if cred.token != "" {
		req.Header.Set("Authorization", "Bearer "+cred.token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{code: resp.StatusCode, header: resp.Header, body: body}
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		a.status = &st
	}
	return a, nil
}

// send is get on a new connection; the test fails on a transport error.
func (tg target) send(t *testing.T, cred credential, path string) answer {
	t.Helper()
	c := tg.client(cred)
	defer c.CloseIdleConnections()
	a, err := tg.get(context.Background(), c, cred, path)
	if err != nil {
		t.Fatalf("%s: GET %s: %v", tg.name, path, err)
	}
	return a
}

// sameRefusal fails unless got refuses the request as want (the
// apiserver's answer to the same read) does: same code, a Status with the
// same reason and message, and nothing of the data. Through the
// aggregator, a request the apiserver refuses before proxying (it
// authorizes the aggregated path first) carries the apiserver's message
// about that path, which names the profile's group: code and reason must
// still be the same.
func sameRefusal(t *testing.T, tg target, got, want answer) {
	t.Helper()
	if want.code < 400 || want.status == nil {
		t.Fatalf("the apiserver did not refuse: %s", want)
	}
	if got.code != want.code || got.status == nil || got.status.Reason != want.status.Reason {
		t.Fatalf("%s answered %s; the apiserver %s", tg.name, got, want)
	}
	byAggregator := tg.aggregated && strings.Contains(got.status.Message, ".cache.cachetier.io")
	if got.status.Message != want.status.Message && !byAggregator {
		t.Fatalf("%s answered %s; the apiserver %s", tg.name, got, want)
	}
	noData(t, tg, got)
}

// noData fails if a refusal carries any of the seeded configmaps' data.
func noData(t *testing.T, tg target, a answer) {
	t.Helper()
	if strings.Contains(string(a.body), "secret-ish") || strings.Contains(string(a.body), `"items"`) {
		t.Fatalf("%s: the refusal carries data: %s", tg.name, a.body)
	}
}

// sameList fails unless got is a 200 with the same items (names and
// resourceVersions) as want.
func sameList(t *testing.T, tg target, got, want answer) {
	t.Helper()
	if want.code != http.StatusOK {
		t.Fatalf("the apiserver did not serve the read: %s", want)
	}
	if got.code != http.StatusOK {
		t.Fatalf("%s answered %s; the apiserver served the read", tg.name, got)
	}
	if g, w := itemKeys(t, got.body), itemKeys(t, want.body); g != w {
		t.Fatalf("%s served %s; the apiserver %s", tg.name, g, w)
	}
}

// itemKeys is a list's items as "name@resourceVersion", or a single
// object's.
func itemKeys(t *testing.T, body []byte) string {
	t.Helper()
	var list struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []struct {
			Metadata struct {
				Name            string `json:"name"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if !strings.HasSuffix(list.Kind, "List") {
		return list.Metadata.Name + "@" + list.Metadata.ResourceVersion
	}
	var keys []string
	for _, it := range list.Items {
		keys = append(keys, it.Metadata.Name+"@"+it.Metadata.ResourceVersion)
	}
	return fmt.Sprintf("%d items %v", len(keys), keys)
}

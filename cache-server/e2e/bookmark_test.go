package e2e

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestBookmarksMatchAPIServer: the initial-events-end bookmark of a
// watch-list is byte for byte the apiserver's (its resourceVersion aside),
// for a built-in resource (a typed object: kind first, resourceVersion
// before annotations) and a custom resource (an Unstructured: sorted
// keys), as the resource and as metadata.
func TestBookmarksMatchAPIServer(t *testing.T) { forEachTier(t, testBookmarksMatchAPIServer) }

func testBookmarksMatchAPIServer(t *testing.T) {
	q := url.Values{
		"watch": {"1"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"},
		"allowWatchBookmarks": {"true"},
		// No object matches: the first event is the bookmark.
		"labelSelector": {"cachetier.io/bookmark-test=none"},
	}
	for _, path := range []string{"/api/v1/configmaps", "/apis/example.cachetier.io/v1/widgets"} {
		for _, accept := range []string{"application/json", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"} {
			want := firstWatchLine(t, testEnv.admin, path, q, accept)
			got := firstWatchLine(t, testEnv.tierAdmin, path, q, accept)
			if !bytes.Equal(got, want) {
				t.Errorf("%s, Accept %s: the first event differs (resourceVersion values replaced by RV)\napiserver: %s\ntier:      %s", path, accept, want, got)
			}
		}
	}
}

var resourceVersionValue = regexp.MustCompile(`"resourceVersion":"[0-9]+"`)

// firstWatchLine opens the watch and returns its first event's line with
// every resourceVersion value replaced by RV.
func firstWatchLine(t *testing.T, cfg *rest.Config, path string, q url.Values, accept string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+path+"?"+q.Encode(), nil)
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", cfg.Host, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s", cfg.Host, path, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatalf("%s %s: no event: %v", cfg.Host, path, sc.Err())
	}
	return resourceVersionValue.ReplaceAll(bytes.TrimSpace(sc.Bytes()), []byte(`"resourceVersion":"RV"`))
}

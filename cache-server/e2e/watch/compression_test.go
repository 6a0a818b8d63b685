package watch

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// rawWatchResult is what TestWatchListCompressionMatchesAPIServer compares:
// the response's encoding headers and, when read, the names of the initial
// ADDED events and whether the initial-events-end bookmark came.
type rawWatchResult struct {
	code            int
	contentEncoding string
	vary            string
	names           []string
	endBookmark     bool
}

// rawWatchEncoded sends a raw watch with the given Accept-Encoding through
// a transport that does not decompress (DisableCompression), so the
// response's own encoding shows. With readInitial it decodes the body (a
// multistream gzip reader for Content-Encoding gzip) up to the
// initial-events-end bookmark, then cancels the request.
func rawWatchEncoded(t *testing.T, cfg *rest.Config, path string, q url.Values, acceptEncoding string, readInitial bool) rawWatchResult {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.DisableCompression = true
	client, err := rest.HTTPClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u := strings.TrimRight(c.Host, "/") + c.APIPath + path + "?" + q.Encode()
	if c.APIPath == "" {
		u = strings.TrimRight(c.Host, "/") + path + "?" + q.Encode()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	req.Header.Set("Accept", "application/json")
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := rawWatchResult{
		code:            resp.StatusCode,
		contentEncoding: resp.Header.Get("Content-Encoding"),
		vary:            strings.Join(resp.Header.Values("Vary"), ","),
	}
	if !readInitial || resp.StatusCode != http.StatusOK {
		return r
	}
	var body io.Reader = resp.Body
	if r.contentEncoding == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		body = zr
	}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev rawEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%s: unparsable frame %q: %v", u, sc.Text(), err)
		}
		m := ev.meta()
		switch ev.Type {
		case "ADDED":
			r.names = append(r.names, m.Metadata.Namespace+"/"+m.Metadata.Name)
		case "BOOKMARK":
			if m.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
				r.endBookmark = true
			}
		default:
			t.Fatalf("%s: unexpected %s event during the initial events: %s", u, ev.Type, sc.Text())
		}
		if r.endBookmark {
			break
		}
	}
	if !r.endBookmark {
		t.Fatalf("%s (Accept-Encoding %q): stream ended without the initial-events-end bookmark after %d events: %v", u, acceptEncoding, len(r.names), sc.Err())
	}
	sort.Strings(r.names)
	return r
}

// TestWatchListCompressionMatchesAPIServer: kube-apiserver 1.37 gzips
// watch-list responses (WatchListCompression) when Accept-Encoding has
// gzip; the tier must answer the same raw requests with the same
// Content-Encoding and Vary, and the decompressed streams must carry the
// same initial objects and the initial-events-end bookmark. Watch-lists
// without gzip, and other watches with it, are not compressed.
func TestWatchListCompressionMatchesAPIServer(t *testing.T) {
	forEachTier(t, testWatchListCompressionMatchesAPIServer)
}

func testWatchListCompressionMatchesAPIServer(t *testing.T) {
	ns := nsName(2)
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	list, err := kc(t, env.Admin).CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watchList := url.Values{"watch": {"true"}, "sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}
	cases := []struct {
		name           string
		q              url.Values
		acceptEncoding string
		readInitial    bool
		wantGzip       bool
	}{
		{"watch-list gzip", watchList, "gzip", true, true},
		{"watch-list gzip among others", watchList, "deflate, gzip", true, true},
		{"watch-list no Accept-Encoding", watchList, "", true, false},
		{"watch-list gzip with q-value", watchList, "gzip;q=1.0", true, false},
		// The apiserver defaults a watch at RV "0" without
		// resourceVersionMatch to a watch-list (WatchList on).
		{"defaulted rv=0 watch-list gzip", url.Values{"watch": {"true"}, "resourceVersion": {"0"}, "allowWatchBookmarks": {"true"}}, "gzip", true, true},
		{"plain watch gzip", url.Values{"watch": {"true"}, "resourceVersion": {list.ResourceVersion}, "allowWatchBookmarks": {"true"}}, "gzip", false, false},
		{"initial events without bookmarks gzip", url.Values{"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"}}, "gzip", false, false},
	}
	for _, tc := range cases {
		a := rawWatchEncoded(t, env.Admin, path, tc.q, tc.acceptEncoding, tc.readInitial)
		b := rawWatchEncoded(t, env.TierAdmin, path, tc.q, tc.acceptEncoding, tc.readInitial)
		if a.code != http.StatusOK || b.code != http.StatusOK {
			t.Fatalf("%s: status apiserver %d, tier %d", tc.name, a.code, b.code)
		}
		if a.contentEncoding != b.contentEncoding || a.vary != b.vary {
			t.Errorf("%s: Content-Encoding/Vary apiserver %q/%q, tier %q/%q", tc.name, a.contentEncoding, a.vary, b.contentEncoding, b.vary)
		}
		if (b.contentEncoding == "gzip") != tc.wantGzip {
			t.Errorf("%s: tier Content-Encoding %q, want gzip %v", tc.name, b.contentEncoding, tc.wantGzip)
		}
		if (a.contentEncoding == "gzip") != tc.wantGzip {
			t.Errorf("%s: apiserver Content-Encoding %q, want gzip %v (is WatchListCompression on?)", tc.name, a.contentEncoding, tc.wantGzip)
		}
		if !tc.readInitial {
			continue
		}
		if len(b.names) == 0 || strings.Join(a.names, ",") != strings.Join(b.names, ",") {
			t.Errorf("%s: initial objects differ\napiserver: %v\ntier:      %v", tc.name, a.names, b.names)
		}
	}
}

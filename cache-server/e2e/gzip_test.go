package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// LISTs over 128 KiB are gzipped by both servers. A standalone tier
// writes them from compressed chunks it kept from earlier LISTs of the
// same objects (package gzipchunks), so the same LIST is asked again,
// after objects changed, and page by page; every time the tier's items
// must be the apiserver's, byte for byte, and its body a valid gzip stream
// (Go's reader checks the CRC and the length).
func TestLargeListBodiesMatchAPIServer(t *testing.T) { forEachTier(t, testLargeListBodies) }

func testLargeListBodies(t *testing.T) {
	ctx := context.Background()
	e := testEnv
	kc, err := kubernetes.NewForConfig(e.admin)
	if err != nil {
		t.Fatal(err)
	}
	ns := "gzip-" + e.name
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) })
	configMap := func(i int, text string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%04d", i), Labels: map[string]string{"n": strconv.Itoa(i % 7)}},
			Data:       map[string]string{"text": strings.Repeat(text+" "+strconv.Itoa(i)+" ", 90)},
		}
	}
	for i := range 200 {
		if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, configMap(i, "first"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	// A fleet's front keeps no chunks (its items come from the shards).
	keeps := e.name == "standalone"
	hits := func() float64 {
		if !keeps {
			return 0
		}
		return chunkHits(t)
	}
	compare := func(round string) {
		t.Helper()
		compareGzipItems(t, round, path, nil, nil)
		// Pages (ranges that start and end inside chunks), each server
		// continuing with its own token.
		wq, gq := query("limit", "150"), query("limit", "150")
		for {
			wc, gc := compareGzipItems(t, round+", page", path, wq, gq)
			if wc == "" {
				break
			}
			wq, gq = query("limit", "150", "continue", wc), query("limit", "150", "continue", gc)
		}
	}
	compare("first LIST")
	before := hits()
	compare("the same LIST again")
	if keeps && hits() <= before {
		t.Fatalf("the second LIST of unchanged objects took no chunk from the tier's cache (hits %v -> %v)", before, hits())
	}
	for i := 10; i < 200; i += 40 {
		if _, err := kc.CoreV1().ConfigMaps(ns).Update(ctx, configMap(i, "changed"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{3, 77, 199} {
		if err := kc.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("cm-%04d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range []int{1000, 1001} {
		if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, configMap(i, "added"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	compare("after changes")
	compare("after changes, again")
}

// compareGzipItems sends a LIST to both servers asking for gzip (query wq
// to the apiserver, gq to the tier: the same but for their own continue
// tokens) and compares the items byte for byte. It returns the
// apiserver's and the tier's continue tokens.
func compareGzipItems(t *testing.T, round, path string, wq, gq url.Values) (string, string) {
	t.Helper()
	type list struct {
		Metadata struct {
			Continue string `json:"continue"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	var lists [2]list
	var gzipped [2]bool
	q := gq.Encode()
	for i, cfg := range []*rest.Config{testEnv.admin, testEnv.tierAdmin} {
		body, gz := getGzip(t, cfg, path, []url.Values{wq, gq}[i])
		gzipped[i] = gz
		if err := json.Unmarshal(body, &lists[i]); err != nil {
			t.Fatalf("%s: %s?%s: %v", round, path, q, err)
		}
	}
	if q == "" && !gzipped[0] {
		t.Fatalf("%s: %s: the apiserver did not gzip the full LIST: the test's data is too small", round, path)
	}
	if gzipped[0] != gzipped[1] {
		t.Fatalf("%s: %s?%s: gzip from the apiserver %v, from the tier %v", round, path, q, gzipped[0], gzipped[1])
	}
	want, got := lists[0].Items, lists[1].Items
	if len(want) != len(got) {
		t.Fatalf("%s: %s?%s: %d items from the tier, %d from the apiserver", round, path, q, len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(want[i], got[i]) {
			t.Fatalf("%s: %s?%s: item %d differs\n tier:      %s\n apiserver: %s", round, path, q, i, got[i], want[i])
		}
	}
	if (lists[0].Metadata.Continue == "") != (lists[1].Metadata.Continue == "") {
		t.Fatalf("%s: %s?%s: continue %q from the tier, %q from the apiserver", round, path, q, lists[1].Metadata.Continue, lists[0].Metadata.Continue)
	}
	return lists[0].Metadata.Continue, lists[1].Metadata.Continue
}

// getGzip GETs path?q asking for gzip itself and returns the
// decompressed body and whether it was compressed.
func getGzip(t *testing.T, cfg *rest.Config, path string, q url.Values) ([]byte, bool) {
	t.Helper()
	r := getWith(t, cfg, path, q, http.Header{"Accept": {"application/json"}, "Accept-Encoding": {"gzip"}})
	if r.code != http.StatusOK {
		t.Fatalf("GET %s?%s: %d %s", path, q.Encode(), r.code, r.body)
	}
	if r.encoding != "gzip" {
		return r.body, false
	}
	zr, err := gzip.NewReader(bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("GET %s?%s: %v", path, q.Encode(), err)
	}
	zr.Multistream(false)
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("GET %s?%s: gzip body: %v", path, q.Encode(), err)
	}
	return b, true
}

// chunkHits is the standalone tier's count of configmaps' LIST chunks
// taken from its cache.
func chunkHits(t *testing.T) float64 {
	t.Helper()
	const series = `cachetier_list_gzip_chunks_total{resource="configmaps",result="hit"}`
	v, err := testEnv.metric(series)
	if err != nil {
		t.Fatal(err)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s: %q: %v", series, v, err)
	}
	return f
}

package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestMetadataAndTableListsMatchAPIServer: JSON PartialObjectMetadataList
// and Table LISTs (v1 and v1beta1, every includeObject) of built-in and
// custom resources, whole and page by page (each server continuing with
// its own token), are the apiserver's documents: items or rows, columns,
// remainingItemCount, whether a page continues. On the fleet these forms
// are streamed from the shards (front.streamList), a page's continue
// token written before rows it knows only after reading them.
func TestMetadataAndTableListsMatchAPIServer(t *testing.T) {
	forEachTier(t, testMetadataAndTableLists)
}

func testMetadataAndTableLists(t *testing.T) {
	const (
		metadataV1      = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
		metadataV1beta1 = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1"
		tableV1         = "application/json;as=Table;g=meta.k8s.io;v=v1"
		tableV1beta1    = "application/json;as=Table;g=meta.k8s.io;v=v1beta1"
	)
	forms := []struct{ accept, include string }{
		{metadataV1, ""},
		{metadataV1beta1, ""},
		{tableV1, ""},
		{tableV1, "None"},
		{tableV1, "Object"},
		{tableV1beta1, "Metadata"},
	}
	targets := []struct{ path, label string }{
		{"/api/v1/configmaps", ""},
		{"/api/v1/namespaces/ns-1/configmaps", "app!=a"},
		{"/api/v1/pods", ""},
		{"/apis/example.cachetier.io/v1/widgets", ""},
	}
	n := 0
	for _, tg := range targets {
		for _, f := range forms {
			for _, limit := range []string{"", "1", "7", "500"} {
				q := query("limit", limit, "labelSelector", tg.label, "includeObject", f.include)
				t.Run(f.accept+" "+tg.path+"?"+q.Encode(), func(t *testing.T) { compareFormPages(t, tg.path, q, f.accept) })
				n++
			}
		}
	}
	t.Logf("compared %d metadata-only and Table LIST walks", n)
}

// compareFormPages walks a LIST's pages on both servers and compares each
// page's document (formDoc).
func compareFormPages(t *testing.T, path string, q url.Values, accept string) {
	t.Helper()
	wq, gq := cloneValues(q), cloneValues(q)
	for page := 0; page < 1000; page++ {
		want := get(t, testEnv.admin, path, wq, accept)
		got := get(t, testEnv.tierAdmin, path, gq, accept)
		if want.code != got.code {
			t.Fatalf("page %d: status %d from tier, %d from apiserver\n tier: %.500s\n apiserver: %.500s", page, got.code, want.code, got.body, want.body)
		}
		if want.code != http.StatusOK {
			if w, g := statusView(t, want.body), statusView(t, got.body); w != g {
				t.Fatalf("page %d: error differs\n tier:      %s\n apiserver: %s", page, g, w)
			}
			return
		}
		wd, wc := formDoc(t, want.body)
		gd, gc := formDoc(t, got.body)
		if wd != gd {
			t.Fatalf("page %d of ?%s: documents differ\n tier:      %.3000s\n apiserver: %.3000s", page, gq.Encode(), gd, wd)
		}
		if strings.Contains(accept, "as=PartialObjectMetadataList") {
			// Byte for byte after the list's own metadata (its RV and
			// continue token differ): each item as the apiserver's typed
			// ObjectMeta writes it, custom resources' too.
			_, wi, _ := bytes.Cut(want.body, []byte(`"items":`))
			_, gi, _ := bytes.Cut(got.body, []byte(`"items":`))
			if !bytes.Equal(wi, gi) {
				t.Fatalf("page %d of ?%s: items differ byte for byte\n tier:      %.3000s\n apiserver: %.3000s", page, gq.Encode(), gi, wi)
			}
		}
		if (wc == "") != (gc == "") {
			t.Fatalf("page %d: continue %q from tier, %q from apiserver", page, gc, wc)
		}
		if wc == "" {
			return
		}
		wq.Set("continue", wc)
		gq.Set("continue", gc)
	}
}

// formDoc is a list document without what differs between two servers
// answering the same LIST a moment apart: its resourceVersion and
// continue token (returned), and an Age column's cells (the time since
// creation when the row was printed).
func formDoc(t *testing.T, body []byte) (doc, continueToken string) {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatalf("%v: %.300s", err, body)
	}
	md, _ := d["metadata"].(map[string]any)
	delete(md, "resourceVersion")
	continueToken, _ = md["continue"].(string)
	delete(md, "continue")
	cols, _ := d["columnDefinitions"].([]any)
	rows, _ := d["rows"].([]any)
	for i, c := range cols {
		if name, _ := c.(map[string]any)["name"].(string); strings.EqualFold(name, "Age") {
			for _, r := range rows {
				r.(map[string]any)["cells"].([]any)[i] = "<age>"
			}
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), continueToken
}

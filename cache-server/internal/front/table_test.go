package front

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/tables"
)

// TestTableResponses: the front hands GET, LIST and watch Tables to the
// resource's printer with the request's options; a stored object the
// printer cannot read is an error Status (and an ERROR event that ends a
// Table watch), counted and never a crash; a bad includeObject is 400.
func TestTableResponses(t *testing.T) {
	objs := benchObjects(2, 16)
	// A ConfigMap whose data is not a map: stored (the ingester reads only
	// what it indexes) but not printable.
	objs = append(objs, []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm-zzz","namespace":"bench","resourceVersion":"1999","creationTimestamp":"2026-11-21T10:00:00Z"},"data":7}`))
	bt := newBenchTierFields(t, objs, true, true)
	defer bt.stop()
	res := bt.srv.resources[schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}]
	res.printer = tables.NewBuiltins().For(res.GVR, "ConfigMap")
	tier := httptest.NewServer(bt.srv)
	defer tier.Close()
	table := "application/json;as=Table;v=v1;g=meta.k8s.io"

	get := func(path string) (int, metav1.Table, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, tier.URL+path, nil)
		req.Header.Set("Accept", table)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		var tbl metav1.Table
		_ = json.Unmarshal(buf.Bytes(), &tbl)
		return resp.StatusCode, tbl, buf.String()
	}

	code, tbl, body := get(benchPath + "/cm-000001?includeObject=None")
	if code != 200 || len(tbl.ColumnDefinitions) != 3 || tbl.ColumnDefinitions[1].Name != "Data" || tbl.Rows[0].Cells[0] != "cm-000001" || tbl.Rows[0].Object.Raw != nil || tbl.ResourceVersion != "1001" {
		t.Errorf("GET: %d %s", code, body)
	}
	code, _, body = get(benchPath + "?includeObject=All")
	if code != 400 || !strings.Contains(body, `Unable to convert to Table as requested: includeObject: Invalid value: \"All\"`) {
		t.Errorf("bad includeObject: %d %s", code, body)
	}
	before := testutil.ToFloat64(bt.srv.opts.Metrics.TableErrors.WithLabelValues("configmaps"))
	code, _, body = get(benchPath)
	if code != 500 || !strings.Contains(body, `"reason":"InternalError"`) || !strings.Contains(body, "cannot build the Table of configmaps") {
		t.Errorf("unprintable object in a LIST: %d %s", code, body)
	}
	code, tbl, body = get(benchPath + "?limit=2")
	if code != 200 || len(tbl.Rows) != 2 || tbl.Continue == "" || tbl.RemainingItemCount == nil || *tbl.RemainingItemCount != 1 {
		t.Errorf("first page: %d %s", code, body)
	}
	if got := testutil.ToFloat64(bt.srv.opts.Metrics.TableErrors.WithLabelValues("configmaps")) - before; got != 1 {
		t.Errorf("table errors counted: %v, want 1", got)
	}

	// A Table watch from RV 0: the initial ADDED Tables (columns on the
	// first only), then the unprintable object's ERROR, then the end.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tier.URL+benchPath+"?watch=1&resourceVersion=0", nil)
	req.Header.Set("Accept", table)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var kinds []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Type   string
			Object struct {
				Kind              string
				ColumnDefinitions []metav1.TableColumnDefinition
				Message           string
			}
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		kinds = append(kinds, ev.Type+"/"+ev.Object.Kind+"/"+strings.Repeat("cols", min(len(ev.Object.ColumnDefinitions), 1)))
		if ev.Type == "ERROR" && !strings.Contains(ev.Object.Message, "cannot build the Table of configmaps") {
			t.Errorf("ERROR event: %s", sc.Bytes())
		}
	}
	if strings.Join(kinds, " ") != "ADDED/Table/cols ADDED/Table/ ERROR/Status/" {
		t.Errorf("watch events %v", kinds)
	}
}

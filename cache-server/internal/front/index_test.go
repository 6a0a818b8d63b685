package front

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// podsJSON are n pods as the apiserver sends them, on node nodeOf(i)
// ("" = unscheduled: no spec.nodeName), in phase phaseOf(i), with size
// bytes of padding.
func podsJSON(n, size int, nodeOf, phaseOf func(i int) string) [][]byte {
	pad := strings.Repeat("p", size)
	out := make([][]byte, n)
	for i := range out {
		node := ""
		if v := nodeOf(i); v != "" {
			node = fmt.Sprintf(`"nodeName":%q,`, v)
		}
		out[i] = fmt.Appendf(nil, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"pod-%06d","namespace":"bench","uid":"6a1c3f55-4f2a-4d8f-9d5e-%012d","resourceVersion":"%d","creationTimestamp":"2026-11-21T10:00:00Z","labels":{"app":"a%d"},"annotations":{"padding":%q}},"spec":{%s"containers":[{"name":"app","image":"registry.example.com/app:1"}],"restartPolicy":"Always","schedulerName":"default-scheduler","serviceAccountName":"default"},"status":{"phase":%q}}`,
			i, i, 1000+i, i%3, pad, node, phaseOf(i))
	}
	return out
}

type listAnswer struct {
	Metadata struct {
		Continue           string `json:"continue"`
		RemainingItemCount *int64 `json:"remainingItemCount"`
		ResourceVersion    string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	} `json:"items"`
}

func (t *benchTier) list(tb testing.TB, path string, q url.Values) listAnswer {
	tb.Helper()
	body := &bytes.Buffer{}
	t.get(tb, body, path+"?"+q.Encode(), nil)
	var l listAnswer
	if err := json.Unmarshal(body.Bytes(), &l); err != nil {
		tb.Fatalf("%s?%s: %v", path, q.Encode(), err)
	}
	return l
}

// TestListByIndex: the front reads pods by node through the index and
// gives a first page the apiserver's index rule (a node whose pods fill
// the page exactly has no continuation though other pods follow), exact
// reads and continue pages the scan rule, and a field only the profile
// indexes the scan rule everywhere; indexed reads are counted.
func TestListByIndex(t *testing.T) {
	// pods 0-4 on n1 and Running; 5-9 on n2; the rest unscheduled or n3,
	// Pending.
	nodeOf := func(i int) string {
		switch {
		case i < 5:
			return "n1"
		case i < 10:
			return "n2"
		case i%2 == 0:
			return ""
		}
		return "n3"
	}
	phaseOf := func(i int) string {
		if i < 5 {
			return "Running"
		}
		return "Pending"
	}
	bt := newBenchTierOf(t, podsJSON(30, 10, nodeOf, phaseOf), benchResource{resource: "pods", kind: "Pod", indexes: []string{"status.phase"}}, true, false)
	defer bt.stop()
	rv := fmt.Sprint(bt.ing.AppliedRV())
	for _, path := range []string{"/api/v1/pods", "/api/v1/namespaces/bench/pods"} {
		for _, c := range []struct {
			query     string
			items     int
			continues bool
		}{
			{"fieldSelector=spec.nodeName%3Dn1&limit=5", 5, false},
			{"fieldSelector=spec.nodeName%3D%3Dn1&limit=5&resourceVersion=" + rv + "&resourceVersionMatch=NotOlderThan", 5, false},
			{"fieldSelector=spec.nodeName%3Dn1&limit=5&resourceVersion=" + rv + "&resourceVersionMatch=Exact", 5, true},
			{"fieldSelector=spec.nodeName%3Dn1&limit=5&resourceVersion=" + rv, 5, true}, // legacy exact
			{"fieldSelector=spec.nodeName%3Dn1&limit=4", 4, true},
			{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=0", 5, false},
			{"fieldSelector=spec.nodeName%3D&limit=10", 10, false}, // unscheduled pods: 10, 12, ... 28
			{"fieldSelector=spec.nodeName%3D,metadata.name!%3Dpod-000028&limit=9", 9, true},
			{"fieldSelector=status.phase%3DRunning&limit=5", 5, true}, // only the profile indexes it: the scan rule
			{"fieldSelector=spec.nodeName!%3Dn1&limit=5", 5, true},
			{"fieldSelector=spec.nodeName%3Dn2&labelSelector=app%3Da0&limit=2", 2, false}, // pods 6 and 9, the last on n2
			{"fieldSelector=spec.nodeName%3Dn2&labelSelector=app%3Da2&limit=2", 2, true},  // pods 5 and 8; pod 9 is on n2 too
		} {
			q, err := url.ParseQuery(c.query)
			if err != nil {
				t.Fatal(err)
			}
			l := bt.list(t, path, q)
			if len(l.Items) != c.items || (l.Metadata.Continue != "") != c.continues || l.Metadata.RemainingItemCount != nil {
				t.Errorf("%s?%s: %d items, continue %q, remaining %v; want %d items, continuation %v", path, c.query,
					len(l.Items), l.Metadata.Continue, l.Metadata.RemainingItemCount, c.items, c.continues)
			}
		}
	}
	if got := testutil.ToFloat64(bt.metrics.IndexedLists.WithLabelValues("pods", "spec.nodeName")); got != 2*10 {
		t.Errorf("indexed lists by spec.nodeName: %v, want 20", got)
	}
	if got := testutil.ToFloat64(bt.metrics.IndexedLists.WithLabelValues("pods", "status.phase")); got != 2*1 {
		t.Errorf("indexed lists by status.phase: %v, want 2", got)
	}
}

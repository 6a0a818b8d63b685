package kubectl

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// jsonView is kubectl's -o json output: one object, or a List of them.
type jsonView struct {
	keys  []string         // kind namespace/name@resourceVersion, in output order
	items []map[string]any // the objects
}

func parseJSON(t *testing.T, out string) jsonView {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("kubectl -o json output is not JSON: %v\n%s", err, clip(out))
	}
	var v jsonView
	if doc["kind"] == "List" {
		items, _ := doc["items"].([]any)
		for _, it := range items {
			v.items = append(v.items, it.(map[string]any))
		}
	} else {
		v.items = []map[string]any{doc}
	}
	for _, it := range v.items {
		md, _ := it["metadata"].(map[string]any)
		v.keys = append(v.keys, fmt.Sprintf("%v %v/%v@%v", it["kind"], md["namespace"], md["name"], md["resourceVersion"]))
	}
	return v
}

// compareJSON runs the same `kubectl get ... -o json` against the apiserver
// and the tier; keys, order, resourceVersions and full object content must
// match.
func compareJSON(t *testing.T, tierKubeconfig string, args ...string) jsonView {
	t.Helper()
	args = append(args, "-o", "json")
	want := parseJSON(t, mustKubectl(t, env.CP.AdminKubeconfig, args...))
	got := parseJSON(t, mustKubectl(t, tierKubeconfig, args...))
	if len(want.keys) == 0 {
		t.Fatalf("kubectl %s: the apiserver returned nothing; the case tests nothing", strings.Join(args, " "))
	}
	if !reflect.DeepEqual(got.keys, want.keys) {
		t.Fatalf("kubectl %s: keys differ\ntier (%d):      %v\napiserver (%d): %v", strings.Join(args, " "), len(got.keys), got.keys, len(want.keys), want.keys)
	}
	for i := range want.items {
		if !reflect.DeepEqual(got.items[i], want.items[i]) {
			g, _ := json.MarshalIndent(got.items[i], "", " ")
			w, _ := json.MarshalIndent(want.items[i], "", " ")
			t.Fatalf("kubectl %s: object %s differs\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), want.keys[i], g, w)
		}
	}
	return got
}

// runBoth runs the same kubectl command against the tier and the
// apiserver; the apiserver must print something.
func runBoth(t *testing.T, tierKubeconfig string, args ...string) (got, want string) {
	t.Helper()
	want = mustKubectl(t, env.CP.AdminKubeconfig, args...)
	got = mustKubectl(t, tierKubeconfig, args...)
	if strings.TrimSpace(want) == "" {
		t.Fatalf("kubectl %s: the apiserver printed nothing; the case tests nothing", strings.Join(args, " "))
	}
	return got, want
}

// compareOutput runs the same kubectl command against both and requires
// identical stdout.
func compareOutput(t *testing.T, tierKubeconfig string, args ...string) string {
	t.Helper()
	got, want := runBoth(t, tierKubeconfig, args...)
	if got != want {
		t.Fatalf("kubectl %s: output differs\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), clip(got), clip(want))
	}
	return got
}

// getCases are the read commands every client path must answer as the
// apiserver does.
var getCases = []struct {
	name string
	args []string
}{
	{"pods all namespaces", []string{"get", "pods", "-A"}},
	{"configmaps all namespaces", []string{"get", "configmaps", "-A"}},
	{"configmaps label selector", []string{"get", "configmaps", "-A", "-l", "app=a,tier=x"}},
	{"configmaps set-based label selector in a namespace", []string{"get", "configmaps", "-n", "ns-2", "-l", "app in (b,c),!tier"}},
	{"pods field selector spec.nodeName", []string{"get", "pods", "-A", "--field-selector", "spec.nodeName=node-1"}},
	{"pods field and label selector", []string{"get", "pods", "-n", "ns-3", "--field-selector", "spec.nodeName!=node-0", "-l", "app=b"}},
	{"secrets field selector type", []string{"get", "secrets", "-A", "--field-selector", "type=example.com/custom"}},
	{"widgets by short name", []string{"get", "wg", "-A"}},
	{"widgets field selector spec.color", []string{"get", "wg", "-A", "--field-selector", "spec.color=red"}},
	{"widgets by full name in a namespace", []string{"get", "widgets.example.cachetier.io", "-n", "ns-1"}},
	{"namespaces", []string{"get", "namespaces", "-l", "team=a"}},
	{"events in a namespace", []string{"get", "events", "-n", "ns-0"}},
	{"one configmap", []string{"get", "configmap", "cm-007", "-n", "ns-2"}},
	{"one pod", []string{"get", "pod", "pod-03", "-n", "ns-1"}},
	{"one widget by short name", []string{"get", "wg", "widget-04", "-n", "ns-3"}},
	{"one namespace", []string{"get", "namespace", "ns-2"}},
	{"several named objects", []string{"get", "configmap", "cm-001", "cm-002", "cm-100", "-n", "ns-0"}},
}

// TestKubectlGet compares kubectl's -o json and -o name output of every case
// against the tier with the same command against the apiserver.
func TestKubectlGet(t *testing.T) {
	for _, c := range getCases {
		t.Run(c.name, func(t *testing.T) {
			compareJSON(t, env.TierKubeconfig, c.args...)
			compareOutput(t, env.TierKubeconfig, append(c.args, "-o", "name")...)
		})
	}
	t.Run("custom-columns", func(t *testing.T) {
		compareOutput(t, env.TierKubeconfig, "get", "pods", "-A", "-o", "custom-columns=NS:.metadata.namespace,NAME:.metadata.name,NODE:.spec.nodeName,RV:.metadata.resourceVersion")
	})
	t.Run("jsonpath", func(t *testing.T) {
		compareOutput(t, env.TierKubeconfig, "get", "secrets", "-n", "ns-1", "-o", "jsonpath={range .items[*]}{.metadata.name} {.type}{\"\\n\"}{end}")
	})
}

// pageRequest matches kubectl -v=6's log line of one page request:
// "Response" verb="GET" url="https://…/api/v1/configmaps?continue=…&limit=50" status="200 OK"
var pageRequest = regexp.MustCompile(`verb="GET" url="https://[^"]+/configmaps\?(continue=[^"&]+&)?limit=50" status="200 OK"`)

// TestKubectlChunking: --chunk-size=50 across the 1,000 configmaps really
// paginates against the tier (kubectl -v=6 logs each page request) and the
// result is the apiserver's, object for object.
func TestKubectlChunking(t *testing.T) {
	args := []string{"get", "configmaps", "-A", "--chunk-size=50", "-o", "name"}
	compareOutput(t, env.TierKubeconfig, args...)

	pages := func(kubeconfig string) (int, int) {
		r := kubectl(t, kubeconfig, append(args, "-v=6")...)
		if r.err != nil {
			t.Fatalf("kubectl: %s", r)
		}
		n, withContinue := 0, 0
		for _, m := range pageRequest.FindAllStringSubmatch(r.stderr, -1) {
			n++
			if m[1] != "" {
				withContinue++
			}
		}
		return n, withContinue
	}
	hits := func() float64 {
		v, err := env.Metric(`cachetier_authn_connection_cache_total{result="hit"}`)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := strconv.ParseFloat(v, 64) // absent before the first hit: 0
		return f
	}
	hitsBefore := hits()
	tierPages, tierContinued := pages(env.TierKubeconfig)
	// kubectl sends its pages over one connection: after the first
	// request, each page's client certificate is not verified again.
	if got := hits() - hitsBefore; got < float64(tierPages-1) {
		t.Errorf("per-connection authentication cache: %v hits for %d pages on one connection", got, tierPages)
	}
	apiPages, apiContinued := pages(env.CP.AdminKubeconfig)
	t.Logf("tier: %d page requests (%d with continue); apiserver: %d (%d)", tierPages, tierContinued, apiPages, apiContinued)
	if tierPages < 20 || tierContinued != tierPages-1 {
		t.Fatalf("tier: %d page requests, %d with a continue token; want >= 20 pages of 50, all but the first continued", tierPages, tierContinued)
	}
	if tierPages != apiPages {
		t.Fatalf("tier served %d pages, the apiserver %d", tierPages, apiPages)
	}
	// -o json with chunking assembles the same list.
	compareJSON(t, env.TierKubeconfig, "get", "configmaps", "-A", "--chunk-size=50", "-l", "tier=x")
}

// TestKubectlWritesRefused: writes through the tier fail with the tier's
// read-only message and change nothing.
func TestKubectlWritesRefused(t *testing.T) {
	for _, args := range [][]string{
		{"create", "configmap", "written-through-tier", "-n", "ns-0", "--from-literal=a=b"},
		{"delete", "configmap", "cm-000", "-n", "ns-0"},
		{"label", "configmap", "cm-001", "-n", "ns-0", "written=yes"},
		{"annotate", "pod", "pod-01", "-n", "ns-0", "written=yes"},
		{"patch", "wg", "widget-01", "-n", "ns-0", "--type=merge", "-p", `{"spec":{"size":99}}`},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			r := kubectl(t, env.TierKubeconfig, args...)
			if r.err == nil {
				t.Fatalf("write through the tier succeeded: %s", r)
			}
			msg := r.stderr + r.stdout
			if !strings.Contains(msg, "cachetier serves a read-only cache") || !strings.Contains(msg, "send writes to the kube-apiserver") {
				t.Fatalf("want the tier's read-only message, got: %s", r)
			}
			t.Logf("%s", strings.TrimSpace(msg))
		})
	}
	// Nothing changed upstream.
	if r := kubectl(t, env.CP.AdminKubeconfig, "get", "configmap", "written-through-tier", "-n", "ns-0"); r.err == nil {
		t.Fatalf("the refused create reached the apiserver")
	}
	mustKubectl(t, env.CP.AdminKubeconfig, "get", "configmap", "cm-000", "-n", "ns-0")
	if out := mustKubectl(t, env.CP.AdminKubeconfig, "get", "configmap", "cm-001", "-n", "ns-0", "-o", "jsonpath={.metadata.labels.written}"); out != "" {
		t.Fatalf("the refused label reached the apiserver")
	}
}

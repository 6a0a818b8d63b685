package kubectl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tables"
	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/hack/bgcmd"
	"github.com/cachetier/cachetier/hack/sampledata"
)

// Server-side Table printing: kubectl's human-readable output through the
// tier equals the apiserver's, cell for cell, on every client path. Only
// cells of time-relative columns (AGE, LAST SEEN, ...) are normalized: they
// change between the two runs.

// tierPaths are the ways a client reaches the tier.
func tierPaths() []struct{ name, kubeconfig string } {
	return []struct{ name, kubeconfig string }{
		{"standalone", env.TierKubeconfig},
		{"aggregated", aggKubeconfig},
		{"fleet", fleetKubeconfig},
	}
}

// ageColumns are the headers of columns whose cells are durations since a
// timestamp (printers' translateTimestampSince, a CRD's date columns).
var ageColumns = map[string]bool{"AGE": true, "LAST SEEN": true, "FIRST SEEN": true}

// cellSep separates the cells of kubectl's tabwriter output (padding 3).
var cellSep = regexp.MustCompile(` {3,}`)

// tableCells splits kubectl's table output into rows of cells and replaces
// the cells of age columns with "<age>". The columns are located by the
// header: header for output without one (--no-headers), otherwise each
// table's own (several resources print one table each).
func tableCells(out string, header []string) [][]string {
	ageIdx := func(header []string) []int {
		var idx []int
		for i, h := range header {
			if ageColumns[h] {
				idx = append(idx, i)
			}
		}
		return idx
	}
	ages := ageIdx(header)
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		cells := cellSep.Split(strings.TrimRight(line, " "), -1)
		if isHeader(line) {
			ages = ageIdx(cells)
		} else {
			for _, i := range ages {
				if i < len(cells) {
					cells[i] = "<age>"
				}
			}
		}
		rows = append(rows, cells)
	}
	return rows
}

// isHeader: kubectl's headers are upper case and start with NAME or
// NAMESPACE; rows start with an object's (lower case) name.
func isHeader(line string) bool {
	return (strings.HasPrefix(line, "NAME ") || strings.HasPrefix(line, "NAMESPACE ")) && strings.ToUpper(line) == line
}

// headerOf is the header row of kubectl's table output.
func headerOf(out string) []string {
	return cellSep.Split(strings.TrimRight(strings.SplitN(out, "\n", 2)[0], " "), -1)
}

// compareTable runs the same kubectl command against the apiserver and
// the tier and requires the same table (ages normalized). With
// --no-headers the header comes from the same command without it.
//
// The cluster is live (the apiserver's repair loops bump their events'
// counts every few minutes): a difference is looked at again, twice, and
// only one that persists fails — a difference the tier makes persists.
func compareTable(t *testing.T, tierKubeconfig string, args ...string) string {
	t.Helper()
	var header []string
	if i := slices.Index(args, "--no-headers"); i >= 0 {
		header = headerOf(mustKubectl(t, env.CP.AdminKubeconfig, append(append([]string{}, args[:i]...), args[i+1:]...)...))
	}
	var got, want string
	var g, w [][]string
	for attempt := 0; attempt < 3; attempt++ {
		got, want = runBoth(t, tierKubeconfig, args...)
		h := header
		if h == nil {
			h = headerOf(want)
		}
		if g, w = tableCells(got, h), tableCells(want, h); slicesEqual2(g, w) {
			return got
		}
		time.Sleep(time.Second)
	}
	t.Errorf("kubectl %s: tables differ\n%s\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), firstDifference(g, w), clip(got), clip(want))
	return got
}

// firstDifference is the first row that differs (a whole table does not
// fit the log).
func firstDifference(got, want [][]string) string {
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w []string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if !slices.Equal(g, w) {
			return fmt.Sprintf("row %d:\ntier:      %q\napiserver: %q", i, g, w)
		}
	}
	return ""
}

func slicesEqual2(a, b [][]string) bool {
	return slices.EqualFunc(a, b, slices.Equal[[]string])
}

// tableCommands are kubectl get's table forms for a resource (the
// namespace of namespaced ones is ns-1).
func tableCommands(resource string, namespaced bool) [][]string {
	scope := []string{"-A"}
	var inNS []string
	if namespaced {
		inNS = []string{"get", resource, "-n", "ns-1"}
	}
	cmds := [][]string{
		append([]string{"get", resource}, scope...),
		append([]string{"get", resource, "-o", "wide"}, scope...),
		append([]string{"get", resource, "--show-labels"}, scope...),
		append([]string{"get", resource, "-L", "app", "-L", "team"}, scope...),
		append([]string{"get", resource, "--sort-by", "{.metadata.name}"}, scope...),
		append([]string{"get", resource, "--no-headers"}, scope...),
		append([]string{"get", resource, "--chunk-size=50"}, scope...),
	}
	if inNS != nil {
		cmds = append(cmds, inNS, append(append([]string{}, inNS...), "-o", "wide", "--sort-by", "{.metadata.resourceVersion}"))
	}
	return cmds
}

// TestKubectlTables: every built-in resource of the sample data, the
// cluster's APIServices (kube-aggregator's convertor) and the widgets CRD (printer columns Color, Size at priority 1, Age) print the
// apiserver's table through every path, in every kubectl table form.
func TestKubectlTables(t *testing.T) {
	resources := []struct {
		name       string
		namespaced bool
	}{{"pods", true}, {"configmaps", true}, {"secrets", true}, {"events", true}, {"widgets", true}, {"namespaces", false}, {"apiservices", false}}
	for _, p := range tierPaths() {
		t.Run(p.name, func(t *testing.T) {
			for _, r := range resources {
				for _, args := range tableCommands(r.name, r.namespaced) {
					t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
						compareTable(t, p.kubeconfig, args...)
					})
				}
			}
			for _, args := range [][]string{
				{"get", "configmap", "cm-007", "-n", "ns-2"},
				{"get", "pod", "pod-03", "-n", "ns-1", "-o", "wide"},
				{"get", "wg", "widget-04", "-n", "ns-3", "-o", "wide"},
				{"get", "namespace", "ns-2", "--show-labels"},
				{"get", "configmaps", "-n", "ns-2", "--chunk-size=7", "-l", "tier=x"},
				{"get", "pods,configmaps,wg", "-n", "ns-0", "-o", "wide"},
			} {
				t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
					compareTable(t, p.kubeconfig, args...)
				})
			}
		})
	}
	// The apiserver's -o wide for widgets shows the priority-1 column; a
	// test that compares two servers printing Name/Age only proves little.
	if out := mustKubectl(t, env.TierKubeconfig, "get", "wg", "-n", "ns-1", "-o", "wide"); !strings.HasPrefix(out, "NAME") ||
		!slices.Equal(headerOf(out), []string{"NAME", "COLOR", "SIZE", "AGE"}) {
		t.Errorf("widgets -o wide header %v", headerOf(out))
	}
	got, want := runBoth(t, env.TierKubeconfig, "get", "pods", "-A", "-o", "wide")
	if !slices.Equal(headerOf(got), []string{"NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"}) {
		t.Errorf("pods -o wide header %v", headerOf(got))
	}
	t.Logf("kubectl get pods -A -o wide\ntier:\n%s\napiserver:\n%s", got, want)
}

// podCase is a pod whose printed STATUS/READY/RESTARTS/... exercise one
// branch of the apiserver's pod printer.
type podCase struct {
	name    string
	spec    func(*corev1.Pod)
	status  *corev1.PodStatus
	pending bool // deleted with a finalizer: Terminating
}

var longAgo = metav1.NewTime(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC))

func podCases() []podCase {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: longAgo}}
	two := func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Image: "registry.example/app:1"})
	}
	withInit := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "init-a", Image: "registry.example/init:1"}, {Name: "init-b", Image: "registry.example/init:1"}}
	}
	always := corev1.ContainerRestartPolicyAlways
	return []podCase{
		{name: "unscheduled", spec: func(p *corev1.Pod) { p.Spec.NodeName = "" }},
		{name: "gated", spec: func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/gate"}}
		}},
		{name: "nominated", spec: func(p *corev1.Pod) { p.Spec.NodeName = "" }, status: &corev1.PodStatus{Phase: corev1.PodPending, NominatedNodeName: "node-2"}},
		{name: "running", spec: two, status: &corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "100.64.1.2", PodIPs: []corev1.PodIP{{IP: "100.64.1.2"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", Ready: true, State: running, RestartCount: 3, LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: longAgo}}},
				{Name: "d", Ready: true, State: running},
			}}},
		{name: "crashloop", status: &corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", RestartCount: 7, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", FinishedAt: longAgo}}}}}},
		{name: "imagepull", status: &corev1.PodStatus{Phase: corev1.PodPending,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}}},
		{name: "succeeded", status: &corev1.PodStatus{Phase: corev1.PodSucceeded,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: longAgo}}}}}},
		{name: "failed-signal", status: &corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Signal: 9}}}}}},
		{name: "failed-exit", status: &corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3}}}}}},
		{name: "evicted", status: &corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}},
		{name: "unknown", status: &corev1.PodStatus{Phase: corev1.PodUnknown, Reason: "NodeLost"}},
		{name: "init-running", spec: withInit, status: &corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "init-a", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: longAgo}}},
				{Name: "init-b", State: running},
			},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}}},
		{name: "init-failed", spec: withInit, status: &corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "init-a", RestartCount: 2, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: longAgo}}},
				{Name: "init-b", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}},
			}}},
		{name: "init-crashloop", spec: withInit, status: &corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "init-a", RestartCount: 4, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			}}},
		{name: "sidecar", spec: func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "side", Image: "registry.example/side:1", RestartPolicy: &always}}
		}, status: &corev1.PodStatus{Phase: corev1.PodRunning,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "side", Ready: true, Started: ptrTo(true), RestartCount: 1, State: running,
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: longAgo}}}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, State: running}}}},
		{name: "gates-unmet", spec: func(p *corev1.Pod) {
			p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "example.com/one"}, {ConditionType: "example.com/two"}}
		}, status: &corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: "example.com/one", Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, State: running}}}},
		{name: "terminating", pending: true, status: &corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "c", Ready: true, State: running}}}},
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestKubectlTablesPodPrinter: pods in every phase and container state the
// pod printer distinguishes, printed through each path as the apiserver
// prints them.
func TestKubectlTablesPodPrinter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	const ns = "tables-pods"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range podCases() {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: ns, Labels: map[string]string{"app": c.name}},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
		}
		if c.pending {
			p.Finalizers = []string{"example.com/keep"}
		}
		if c.spec != nil {
			c.spec(p)
		}
		created, err := kc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", c.name, err)
		}
		if c.status != nil {
			created.Status = *c.status
			if _, err := kc.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("status of %s: %v", c.name, err)
			}
		}
		if c.pending {
			if err := kc.CoreV1().Pods(ns).Delete(ctx, c.name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_, _ = kc.CoreV1().Pods(ns).Patch(context.Background(), c.name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
			})
		}
	}
	want := mustKubectl(t, env.CP.AdminKubeconfig, "get", "pods", "-n", ns, "-o", "wide")
	t.Logf("apiserver:\n%s", want)
	for _, status := range []string{"Terminating", "Init:1/2", "Init:Error", "Init:CrashLoopBackOff", "SchedulingGated", "Evicted", "NodeLost", "Signal:9", "ExitCode:3", "Completed", "CrashLoopBackOff", "ImagePullBackOff"} {
		if !strings.Contains(want, " "+status+" ") {
			t.Errorf("the apiserver's output lacks STATUS %s: the case does not exercise it", status)
		}
	}
	for _, p := range tierPaths() {
		t.Run(p.name, func(t *testing.T) {
			compareTable(t, p.kubeconfig, "get", "pods", "-n", ns, "-o", "wide")
			compareTable(t, p.kubeconfig, "get", "pods", "-n", ns, "--sort-by", "{.status.phase}", "--show-labels")
			compareTable(t, p.kubeconfig, "get", "pod", "init-failed", "-n", ns, "-o", "wide")
		})
	}
}

// watchRun is a running `kubectl get -w`.
type watchRun struct {
	*bgcmd.Cmd
}

func (w *watchRun) String() string { return w.Stdout.String() }

func startWatch(t *testing.T, kubeconfig string, args ...string) *watchRun {
	t.Helper()
	c, err := bgcmd.Start(env.CP.Kubectl(), append([]string{"--kubeconfig=" + kubeconfig, "--cache-dir=" + t.TempDir()}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return &watchRun{c}
}

func waitLines(t *testing.T, w *watchRun, n int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if out := w.String(); strings.Count(out, "\n") >= n {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("kubectl %v printed %d lines in 30s, want %d:\n%s\nstderr:\n%s", w.Args, strings.Count(w.String(), "\n"), n, w.String(), w.Stderr.String())
	return ""
}

// TestKubectlTablesWatch: `kubectl get -w` (a Table LIST, then a Table
// watch whose first event carries the columns) prints the same lines
// through every path as from the apiserver, for the initial rows and for
// the rows of a change.
func TestKubectlTablesWatch(t *testing.T) {
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	dyn := dynamic.NewForConfigOrDie(env.Admin)
	ctx := context.Background()
	for _, args := range [][]string{
		{"get", "pods", "-n", "ns-2", "-w", "--show-labels", "-o", "wide"},
		{"get", "wg", "-n", "ns-2", "-w", "-o", "wide"},
	} {
		t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
			kubeconfigs := []string{env.CP.AdminKubeconfig}
			for _, p := range tierPaths() {
				kubeconfigs = append(kubeconfigs, p.kubeconfig)
			}
			var runs []*watchRun
			for _, k := range kubeconfigs {
				runs = append(runs, startWatch(t, k, args...))
			}
			listed := strings.Count(mustKubectl(t, env.CP.AdminKubeconfig, withoutWatch(args)...), "\n")
			for _, w := range runs {
				waitLines(t, w, listed)
			}
			// A change every watcher sees: one more row each.
			label := []byte(fmt.Sprintf(`{"metadata":{"labels":{"tables-watch":"%d"}}}`, time.Now().UnixNano()))
			var err error
			if args[1] == "pods" {
				_, err = kc.CoreV1().Pods("ns-2").Patch(ctx, "pod-01", types.MergePatchType, label, metav1.PatchOptions{})
			} else {
				_, err = dyn.Resource(sampledata.WidgetsGVR()).Namespace("ns-2").Patch(ctx, "widget-01", types.MergePatchType, label, metav1.PatchOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			header := headerOf(waitLines(t, runs[0], listed))
			want := tableCells(waitLines(t, runs[0], listed+1), header)
			for i, w := range runs[1:] {
				got := tableCells(waitLines(t, w, listed+1), header)
				if !slicesEqual2(got, want) {
					t.Errorf("%s: -w output differs\ntier:\n%s\napiserver:\n%s", tierPaths()[i].name, w.String(), runs[0].String())
				}
			}
		})
	}
}

func withoutWatch(args []string) []string {
	var out []string
	for _, a := range args {
		if a != "-w" {
			out = append(out, a)
		}
	}
	return out
}

// getAs GETs path from cfg's server with the Accept header accept.
func getAs(t *testing.T, cfg *rest.Config, path, accept string) *http.Response {
	t.Helper()
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, strings.TrimRight(cfg.Host, "/")+path, nil)
	req.Header.Set("Accept", accept)
	resp, err := (&http.Client{Transport: rt, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tableJSON GETs path with the Table Accept header from cfg's server and
// returns the status code and the decoded body with the cells of
// age-like columns replaced.
func tableJSON(t *testing.T, cfg *rest.Config, path string) (int, map[string]any) {
	t.Helper()
	resp := getAs(t, cfg, path, "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, body)
	}
	cols, _ := doc["columnDefinitions"].([]any)
	normalizeTableJSON(doc, cols)
	return resp.StatusCode, doc
}

// normalizeTableJSON replaces the cells of age-like columns, located by
// the column definitions cols (a watch's later Tables have none).
func normalizeTableJSON(doc map[string]any, cols []any) {
	var ageIdx []int
	for i, c := range cols {
		if ageColumns[strings.ToUpper(c.(map[string]any)["name"].(string))] {
			ageIdx = append(ageIdx, i)
		}
	}
	rows, _ := doc["rows"].([]any)
	for _, r := range rows {
		cells := r.(map[string]any)["cells"].([]any)
		for _, i := range ageIdx {
			cells[i] = "<age>"
		}
	}
}

// TestTableJSON compares the Table documents themselves (column
// definitions with types, formats, priorities and descriptions; cells;
// row conditions; row objects for each includeObject; list metadata) and
// the answer to a bad includeObject.
func TestTableJSON(t *testing.T) {
	tier := rest.CopyConfig(env.TierAdmin)
	for _, path := range []string{
		"/api/v1/namespaces/ns-1/pods",
		"/api/v1/namespaces/ns-1/pods?includeObject=None",
		"/api/v1/namespaces/ns-1/pods?includeObject=Object",
		"/api/v1/namespaces/ns-1/pods/pod-02?includeObject=Metadata",
		"/api/v1/namespaces/ns-1/events",
		"/api/v1/namespaces?labelSelector=team%3Da",
		"/api/v1/namespaces/ns-1/secrets",
		"/api/v1/namespaces/ns-1/configmaps/cm-001",
		"/apis/example.cachetier.io/v1/namespaces/ns-1/widgets?includeObject=Object",
		"/apis/example.cachetier.io/v1/namespaces/ns-1/widgets/widget-01",
		"/api/v1/namespaces/ns-1/pods?includeObject=Everything",
		"/api/v1/namespaces/ns-1/pods/nope?includeObject=Everything",
	} {
		t.Run(path, func(t *testing.T) {
			wc, want := tableJSON(t, env.Admin, path)
			gc, got := tableJSON(t, tier, path)
			if !strings.Contains(path, "/pods/") && !strings.Contains(path, "/configmaps/") && !strings.Contains(path, "/widgets/") && wc == 200 {
				// A LIST: the RVs differ between the two servers' reads only
				// by the moment they were taken.
				delete(want["metadata"].(map[string]any), "resourceVersion")
				delete(got["metadata"].(map[string]any), "resourceVersion")
			}
			if gc != wc || !marshalsEqual(got, want) {
				g, _ := json.MarshalIndent(got, "", " ")
				w, _ := json.MarshalIndent(want, "", " ")
				t.Errorf("status %d, want %d\ntier:\n%s\napiserver:\n%s", gc, wc, clip(string(g)), clip(string(w)))
			}
		})
	}
	t.Run("paginated", func(t *testing.T) {
		_, first := tableJSON(t, tier, "/api/v1/configmaps?limit=300")
		md := first["metadata"].(map[string]any)
		if md["continue"] == nil || md["remainingItemCount"] == nil || len(first["rows"].([]any)) != 300 {
			t.Fatalf("first page metadata %v, %d rows", md, len(first["rows"].([]any)))
		}
		_, next := tableJSON(t, tier, "/api/v1/configmaps?limit=300&continue="+md["continue"].(string))
		if len(next["rows"].([]any)) != 300 || next["metadata"].(map[string]any)["resourceVersion"] != md["resourceVersion"] {
			t.Fatalf("second page %v", next["metadata"])
		}
	})
}

func marshalsEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// watchTable reads the events of a Table watch until it ends.
func watchTable(t *testing.T, cfg *rest.Config, path string) []map[string]any {
	t.Helper()
	resp := getAs(t, cfg, path, "application/json;as=Table;v=v1;g=meta.k8s.io")
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	var events []map[string]any
	var cols []any
	for {
		var ev map[string]any
		if err := dec.Decode(&ev); err != nil {
			break
		}
		if obj, ok := ev["object"].(map[string]any); ok {
			if c, ok := obj["columnDefinitions"].([]any); ok && cols == nil {
				cols = c
			}
			normalizeTableJSON(obj, cols)
			delete(obj["metadata"].(map[string]any), "resourceVersion")
		}
		events = append(events, ev)
	}
	return events
}

// TestTableWatchJSON: a Table watch's events as the apiserver sends them:
// the initial ADDED events (watch without resourceVersion) each a Table of
// one row, column definitions on the first only.
func TestTableWatchJSON(t *testing.T) {
	for _, path := range []string{
		"/api/v1/namespaces/ns-3/pods?watch=1&timeoutSeconds=2",
		"/apis/example.cachetier.io/v1/namespaces/ns-3/widgets?watch=1&timeoutSeconds=2&includeObject=None",
	} {
		t.Run(path, func(t *testing.T) {
			want := watchTable(t, env.Admin, path)
			got := watchTable(t, env.TierAdmin, path)
			if len(want) == 0 {
				t.Fatal("the apiserver sent no events; the case tests nothing")
			}
			// The first event's Table carries the column definitions, the
			// others none (NoHeaders after the first).
			cols := func(evs []map[string]any) []any {
				var out []any
				for _, ev := range evs {
					out = append(out, ev["object"].(map[string]any)["columnDefinitions"])
				}
				return out
			}
			if !marshalsEqual(cols(got), cols(want)) {
				t.Errorf("column definitions per event:\ntier:      %v\napiserver: %v", cols(got), cols(want))
			}
			// The initial events' order is the caches' own: compare them
			// as a set of (type, table without columns).
			if g, w := eventSet(got), eventSet(want); !slices.Equal(g, w) {
				t.Errorf("events differ\ntier:\n%s\napiserver:\n%s", clip(strings.Join(g, "\n")), clip(strings.Join(w, "\n")))
			}
		})
	}
}

func eventSet(evs []map[string]any) []string {
	var out []string
	for _, ev := range evs {
		obj := ev["object"].(map[string]any)
		cp := map[string]any{}
		for k, v := range obj {
			if k != "columnDefinitions" {
				cp[k] = v
			}
		}
		b, _ := json.Marshal(map[string]any{"type": ev["type"], "object": cp})
		out = append(out, string(b))
	}
	sort.Strings(out)
	return out
}

// TestKubectlTablesFollowTheCRD: a change to the CRD's printer columns
// reaches the tier's tables (it watches the CRD) on every path.
func TestKubectlTablesFollowTheCRD(t *testing.T) {
	ctx := context.Background()
	ext := apiextensionsclient.NewForConfigOrDie(env.Admin)
	crds := ext.ApiextensionsV1().CustomResourceDefinitions()
	orig, err := crds.Get(ctx, "widgets.example.cachetier.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	update := func(cols []apiextensionsv1.CustomResourceColumnDefinition) {
		crd, err := crds.Get(ctx, orig.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		crd.Spec.Versions[0].AdditionalPrinterColumns = cols
		if _, err := crds.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { update(orig.Spec.Versions[0].AdditionalPrinterColumns) })
	update([]apiextensionsv1.CustomResourceColumnDefinition{
		{Name: "Shade", Type: "string", JSONPath: ".spec.color"},
		{Name: "Bigness", Type: "integer", JSONPath: ".spec.size", Priority: 1},
	})
	args := []string{"get", "wg", "-n", "ns-0", "-o", "wide"}
	want := mustKubectl(t, env.CP.AdminKubeconfig, args...)
	if !slices.Equal(headerOf(want), []string{"NAME", "SHADE", "BIGNESS"}) {
		t.Fatalf("the apiserver does not print the new columns yet:\n%s", want)
	}
	for _, p := range tierPaths() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := mustKubectl(t, p.kubeconfig, args...)
			if got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: columns did not follow the CRD in 30s\ntier:\n%s\napiserver:\n%s", p.name, got, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// TestTablesCRDWatchUnderTheFleetRole: the fleet's ClusterRole (as the
// operator renders it) lets the cache-server list and watch its custom
// resources' CRDs by name, which is how a printer follows the printer
// columns; run as a user bound to exactly that role.
func TestTablesCRDWatchUnderTheFleetRole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	p := &v1alpha1.CacheProfile{ObjectMeta: metav1.ObjectMeta{Name: "tables-rbac"}, Spec: profile()}
	role := controllers.BuildClusterRole(p)
	role.Name = "cachetier-tables-rbac"
	role.OwnerReferences = nil
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const user = "cachetier-tables-rbac"
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = kc.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	asUser := rest.CopyConfig(env.Admin)
	asUser.Impersonate = rest.ImpersonationConfig{UserName: user}
	ext := apiextensionsclient.NewForConfigOrDie(asUser)
	// The role allows exactly these CRDs: a list of all of them is refused.
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the fleet role lists every CRD; want only the cached ones by name")
	}

	gr := sampledata.WidgetsGVR().GroupResource()
	printer := tables.NewCustom(gr, "v1", nil) // Age only until the watch delivers the CRD
	go printer.Watch(ctx, ext, "widgets.example.cachetier.io", logr.Discard())
	widget := []byte(`{"apiVersion":"example.cachetier.io/v1","kind":"Widget","metadata":{"name":"w","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"color":"red","size":1}}`)
	for {
		tbl, err := printer.Table([][]byte{widget}, false, metav1.ListMeta{}, tables.Options{GroupVersion: metav1.SchemeGroupVersion})
		if err != nil {
			t.Fatal(err)
		}
		if len(tbl.ColumnDefinitions) > 1 && tbl.ColumnDefinitions[1].Name == "Color" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the printer never saw the CRD's columns under the fleet role: %+v", tbl.ColumnDefinitions)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

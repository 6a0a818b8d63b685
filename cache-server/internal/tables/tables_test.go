package tables

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/apis/core"
	corev1conv "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/printers"
	printersinternal "k8s.io/kubernetes/pkg/printers/internalversion"
)

var (
	podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	v1Opts  = Options{GroupVersion: metav1.SchemeGroupVersion}
	created = metav1.NewTime(time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC))
)

// samplePod is a running pod with a restarted container, a waiting init
// container, a readiness gate and a nominated node: most of printPod's
// branches.
func samplePod(name string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "42", CreationTimestamp: created,
			Labels: map[string]string{"app": "a"}, UID: k8stypes.UID("u-" + name)},
		Spec: corev1.PodSpec{
			NodeName:       "node-1",
			InitContainers: []corev1.Container{{Name: "init", Image: "i"}},
			Containers:     []corev1.Container{{Name: "c", Image: "i"}, {Name: "d", Image: "i"}},
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/gate"}},
		},
		Status: corev1.PodStatus{
			Phase:             corev1.PodRunning,
			PodIP:             "100.64.0.7",
			NominatedNodeName: "node-2",
			Conditions:        []corev1.PodCondition{{Type: "example.com/gate", Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "c", Ready: true, RestartCount: 3, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: created}}},
				{Name: "d", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			},
		},
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// direct is what the apiserver's pod registry produces for pod: the
// printers on the internal object, all columns (Wide), before asTable.
func direct(t *testing.T, obj any) *metav1.Table {
	t.Helper()
	g := printers.NewTableGenerator().With(printersinternal.AddHandlers)
	var in runtime.Object
	switch o := obj.(type) {
	case *corev1.Pod:
		var p core.Pod
		if err := corev1conv.Convert_v1_Pod_To_core_Pod(o, &p, nil); err != nil {
			t.Fatal(err)
		}
		in = &p
	case *corev1.PodList:
		var l core.PodList
		if err := corev1conv.Convert_v1_PodList_To_core_PodList(o, &l, nil); err != nil {
			t.Fatal(err)
		}
		in = &l
	}
	tbl, err := g.GenerateTable(in, printers.GenerateOptions{Wide: true})
	if err != nil {
		t.Fatal(err)
	}
	return tbl
}

func TestPodTableIsThePrinters(t *testing.T) {
	p := NewBuiltins().For(podsGVR, "Pod")
	if _, ok := p.(*builtin); !ok {
		t.Fatalf("pods printer is %T, want the printers", p)
	}
	pods := []*corev1.Pod{samplePod("a"), samplePod("b")}
	pods[1].Status = corev1.PodStatus{Phase: corev1.PodPending, Reason: "Evicted"}
	pods[1].DeletionTimestamp = &created
	raws := [][]byte{mustJSON(t, pods[0]), mustJSON(t, pods[1])}

	got, err := p.Table(raws, true, metav1.ListMeta{ResourceVersion: "77", Continue: "tok", RemainingItemCount: ptr(int64(5))}, v1Opts)
	if err != nil {
		t.Fatal(err)
	}
	want := direct(t, &corev1.PodList{Items: []corev1.Pod{*pods[0], *pods[1]}})
	if !reflect.DeepEqual(got.ColumnDefinitions, want.ColumnDefinitions) {
		t.Errorf("columns:\n%+v\nwant\n%+v", got.ColumnDefinitions, want.ColumnDefinitions)
	}
	if len(got.Rows) != 2 {
		t.Fatalf("%d rows", len(got.Rows))
	}
	for i := range got.Rows {
		if !reflect.DeepEqual(got.Rows[i].Cells, want.Rows[i].Cells) {
			t.Errorf("row %d cells %v, want %v", i, got.Rows[i].Cells, want.Rows[i].Cells)
		}
		if !reflect.DeepEqual(got.Rows[i].Conditions, want.Rows[i].Conditions) {
			t.Errorf("row %d conditions %v, want %v", i, got.Rows[i].Conditions, want.Rows[i].Conditions)
		}
	}
	if got.ResourceVersion != "77" || got.Continue != "tok" || got.RemainingItemCount == nil || *got.RemainingItemCount != 5 {
		t.Errorf("list meta %+v", got.ListMeta)
	}
	if got.Kind != "Table" || got.APIVersion != "meta.k8s.io/v1" {
		t.Errorf("type meta %+v", got.TypeMeta)
	}
	// Default includeObject is Metadata: PartialObjectMetadata of the row.
	var pm metav1.PartialObjectMetadata
	if err := json.Unmarshal(got.Rows[0].Object.Raw, &pm); err != nil {
		t.Fatal(err)
	}
	if pm.Kind != "PartialObjectMetadata" || pm.APIVersion != "meta.k8s.io/v1" || pm.Name != "a" || pm.ResourceVersion != "42" || pm.Labels["app"] != "a" {
		t.Errorf("row object %s", got.Rows[0].Object.Raw)
	}

	// One object (GET): the object's RV, all columns.
	one, err := p.Table(raws[:1], false, metav1.ListMeta{}, v1Opts)
	if err != nil {
		t.Fatal(err)
	}
	wantOne := direct(t, pods[0])
	if one.ResourceVersion != "42" || !reflect.DeepEqual(one.Rows[0].Cells, wantOne.Rows[0].Cells) {
		t.Errorf("single: rv %q cells %v, want %v", one.ResourceVersion, one.Rows[0].Cells, wantOne.Rows[0].Cells)
	}
}

func ptr[T any](v T) *T { return &v }

func TestIncludeObject(t *testing.T) {
	p := NewBuiltins().For(podsGVR, "Pod")
	raw := mustJSON(t, samplePod("a"))
	for _, tc := range []struct {
		policy metav1.IncludeObjectPolicy
		gv     schema.GroupVersion
		check  func(t *testing.T, b []byte)
	}{
		{metav1.IncludeNone, metav1.SchemeGroupVersion, func(t *testing.T, b []byte) {
			if b != nil {
				t.Errorf("None: %s", b)
			}
		}},
		{metav1.IncludeObject, metav1.SchemeGroupVersion, func(t *testing.T, b []byte) {
			if string(b) != string(raw) {
				t.Errorf("Object: %s", b)
			}
		}},
		{metav1.IncludeMetadata, metav1beta1.SchemeGroupVersion, func(t *testing.T, b []byte) {
			if !strings.HasPrefix(string(b), `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1beta1","metadata":{"name":"a"`) {
				t.Errorf("Metadata: %s", b)
			}
		}},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			got, err := p.Table([][]byte{raw}, false, metav1.ListMeta{}, Options{TableOptions: metav1.TableOptions{IncludeObject: tc.policy}, GroupVersion: tc.gv})
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, got.Rows[0].Object.Raw)
			if got.APIVersion != tc.gv.String() {
				t.Errorf("apiVersion %s", got.APIVersion)
			}
		})
	}
	// The initial-events-end bookmark's row always carries metadata
	// (asTable), even when Object was asked for.
	bm := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}`)
	got, err := p.Table([][]byte{bm}, false, metav1.ListMeta{}, Options{TableOptions: metav1.TableOptions{IncludeObject: metav1.IncludeObject, NoHeaders: true}, GroupVersion: metav1.SchemeGroupVersion})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got.Rows[0].Object.Raw), `"kind":"PartialObjectMetadata"`) || got.ColumnDefinitions != nil {
		t.Errorf("bookmark table %+v %s", got.ColumnDefinitions, got.Rows[0].Object.Raw)
	}
}

func TestParseOptions(t *testing.T) {
	o, err := ParseOptions(url.Values{"includeObject": {"Object"}})
	if err != nil || o.IncludeObject != metav1.IncludeObject {
		t.Fatalf("%+v %v", o, err)
	}
	_, err = ParseOptions(url.Values{"includeObject": {"Everything"}})
	if !apierrors.IsBadRequest(err) || err.Error() != `Unable to convert to Table as requested: includeObject: Invalid value: "Everything": must be 'Metadata', 'Object', 'None', or empty` {
		t.Fatalf("%v", err)
	}
}

func TestDefaultTableForRegistriesWithoutPrinter(t *testing.T) {
	b := NewBuiltins()
	p := b.For(schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, "Role")
	role := &rbacv1.Role{TypeMeta: metav1.TypeMeta{Kind: "Role", APIVersion: "rbac.authorization.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns", CreationTimestamp: created, ResourceVersion: "5"}}
	got, err := p.Table([][]byte{mustJSON(t, role)}, true, metav1.ListMeta{ResourceVersion: "6"}, v1Opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ColumnDefinitions) != 2 || got.ColumnDefinitions[1].Name != "Created At" ||
		!reflect.DeepEqual(got.Rows[0].Cells, []any{"r", "2020-01-02T03:04:05Z"}) || got.ResourceVersion != "6" {
		t.Errorf("%+v", got)
	}
	// Unknown to the scheme (an aggregated API): the default convertor.
	if _, ok := b.For(schema.GroupVersionResource{Group: "metrics.k8s.io", Version: "v1beta1", Resource: "pods"}, "PodMetrics").(*generic); !ok {
		t.Error("unknown group does not get the default convertor")
	}
}

// TestAPIServiceTable: APIServices are printed by kube-aggregator's own
// convertor (Service, Available), not the default one.
func TestAPIServiceTable(t *testing.T) {
	p := NewBuiltins().For(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}, "APIService")
	items := [][]byte{
		[]byte(`{"kind":"APIService","apiVersion":"apiregistration.k8s.io/v1","metadata":{"name":"v1.","resourceVersion":"4","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"version":"v1","groupPriorityMinimum":18000,"versionPriority":1},"status":{"conditions":[{"type":"Available","status":"True","lastTransitionTime":"2020-01-02T03:04:05Z","reason":"Local","message":"Local APIServices are always available"}]}}`),
		[]byte(`{"kind":"APIService","apiVersion":"apiregistration.k8s.io/v1","metadata":{"name":"v1alpha1.x.example.io","resourceVersion":"5","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"group":"x.example.io","version":"v1alpha1","service":{"namespace":"ns","name":"svc","port":443},"groupPriorityMinimum":100,"versionPriority":10},"status":{"conditions":[{"type":"Available","status":"False","lastTransitionTime":"2020-01-02T03:04:05Z","reason":"MissingEndpoints","message":"no endpoints"}]}}`),
	}
	got, err := p.Table(items, true, metav1.ListMeta{ResourceVersion: "6"}, v1Opts)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range got.ColumnDefinitions {
		names = append(names, c.Name)
	}
	if !reflect.DeepEqual(names, []string{"Name", "Service", "Available", "Age"}) {
		t.Fatalf("columns %v", names)
	}
	if len(got.Rows) != 2 || !reflect.DeepEqual(got.Rows[0].Cells[:3], []any{"v1.", "Local", "True"}) ||
		!reflect.DeepEqual(got.Rows[1].Cells[:3], []any{"v1alpha1.x.example.io", "ns/svc", "False (MissingEndpoints)"}) || got.ResourceVersion != "6" {
		t.Errorf("%+v", got)
	}
}

func widgetCRD(cols ...apiextensionsv1.CustomResourceColumnDefinition) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", AdditionalPrinterColumns: cols}, {Name: "v2"}},
	}}
}

func TestCustomColumns(t *testing.T) {
	gr := schema.GroupResource{Group: "example.cachetier.io", Resource: "widgets"}
	w := []byte(`{"apiVersion":"example.cachetier.io/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"3","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"color":"red","size":7,"ratio":0.5}}`)
	c := NewCustom(gr, "v1", widgetCRD(
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Color", Type: "string", JSONPath: ".spec.color"},
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1, Description: "how big"},
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Ratio", Type: "number", JSONPath: ".spec.ratio"},
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Missing", Type: "string", JSONPath: ".spec.nothing"},
	))
	got, err := c.Table([][]byte{w}, false, metav1.ListMeta{}, v1Opts)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, col := range got.ColumnDefinitions {
		names = append(names, fmt.Sprintf("%s/%s/%d", col.Name, col.Type, col.Priority))
	}
	if strings.Join(names, ",") != "Name/string/0,Color/string/0,Size/integer/1,Ratio/number/0,Missing/string/0" {
		t.Errorf("columns %v", names)
	}
	if got.ColumnDefinitions[2].Description != "how big" || got.ColumnDefinitions[1].Description != "Custom resource definition column (in JSONPath format): .spec.color" {
		t.Errorf("descriptions %+v", got.ColumnDefinitions)
	}
	if !reflect.DeepEqual(got.Rows[0].Cells, []any{"w", "red", int64(7), 0.5, nil}) || got.ResourceVersion != "3" {
		t.Errorf("cells %#v rv %s", got.Rows[0].Cells, got.ResourceVersion)
	}

	// A version without columns: Name and Age; an update follows the CRD.
	v2 := NewCustom(gr, "v2", widgetCRD())
	got, _ = v2.Table([][]byte{w}, false, metav1.ListMeta{}, v1Opts)
	if len(got.ColumnDefinitions) != 2 || got.ColumnDefinitions[1].Name != "Age" || got.ColumnDefinitions[1].Type != "date" {
		t.Errorf("default columns %+v", got.ColumnDefinitions)
	}
	c.Update(widgetCRD(apiextensionsv1.CustomResourceColumnDefinition{Name: "Only", Type: "string", JSONPath: ".spec.color"}))
	got, _ = c.Table([][]byte{w}, false, metav1.ListMeta{}, v1Opts)
	if len(got.ColumnDefinitions) != 2 || got.ColumnDefinitions[1].Name != "Only" {
		t.Errorf("after update %+v", got.ColumnDefinitions)
	}
}

func TestBadInputIsAConversionError(t *testing.T) {
	b := NewBuiltins()
	printers := map[string]Printer{
		"pods":    b.For(podsGVR, "Pod"),
		"default": Default(schema.GroupResource{Resource: "things"}),
		"custom":  NewCustom(schema.GroupResource{Group: "g", Resource: "w"}, "v1", nil),
	}
	for name, p := range printers {
		for _, raw := range []string{``, `{`, `[]`, `null`, `{"kind":"Pod","apiVersion":"v1","metadata":"x"}`, `{"kind":"ConfigMap","apiVersion":"v1"}`, `{"kind":"Pod","apiVersion":"v1","spec":{"containers":7}}`} {
			for _, list := range []bool{false, true} {
				_, err := p.Table([][]byte{[]byte(raw)}, list, metav1.ListMeta{}, v1Opts)
				var ce *ConversionError
				if name == "pods" && !errors.As(err, &ce) {
					t.Errorf("%s %q list=%v: %v, want a ConversionError", name, raw, list, err)
				}
				if err != nil && toCode(err) != 500 {
					t.Errorf("%s %q: code %d", name, raw, toCode(err))
				}
			}
		}
	}
}

func toCode(err error) int32 {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code
	}
	return 500
}

// FuzzTable: no input makes a printer crash the process.
func FuzzTable(f *testing.F) {
	f.Add(mustJSON(f, samplePod("a")), false)
	f.Add([]byte(`{"apiVersion":"example.cachetier.io/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"color":7}}`), true)
	f.Add([]byte(`{"kind":"Pod","apiVersion":"v1","status":{"containerStatuses":[{"state":{"terminated":{"exitCode":1}}}]}}`), true)
	b := NewBuiltins()
	ps := []Printer{
		b.For(podsGVR, "Pod"),
		b.For(schema.GroupVersionResource{Version: "v1", Resource: "events"}, "Event"),
		NewCustom(schema.GroupResource{Group: "example.cachetier.io", Resource: "widgets"}, "v1", widgetCRD(
			apiextensionsv1.CustomResourceColumnDefinition{Name: "Color", Type: "string", JSONPath: ".spec.color"},
			apiextensionsv1.CustomResourceColumnDefinition{Name: "When", Type: "date", JSONPath: ".spec.color"})),
	}
	f.Fuzz(func(t *testing.T, raw []byte, list bool) {
		for _, p := range ps {
			_, _ = p.Table([][]byte{raw}, list, metav1.ListMeta{}, Options{TableOptions: metav1.TableOptions{IncludeObject: metav1.IncludeObject}, GroupVersion: metav1.SchemeGroupVersion})
		}
	})
}

package tables

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// writeList is the Table of items written by a List in batches of the
// given sizes (cycled), as the front writes a LIST.
func writeList(t *testing.T, l *List, items [][]byte, sizes []int) []byte {
	t.Helper()
	var out bytes.Buffer
	out.Write(l.Head())
	for i := 0; len(items) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(items))
		if err := l.WriteRows(&out, items[:n]); err != nil {
			t.Fatal(err)
		}
		items = items[n:]
	}
	out.Write(l.Tail())
	return out.Bytes()
}

// TestListMatchesTable: a List writes byte for byte what json.Marshal of
// the whole Table gives (the front's body before it streamed Tables), for
// real objects of the printers' kinds (the printers, the default
// convertor, kube-aggregator's and a custom resource's), every
// includeObject, both Table versions, without headers, and any batching.
func TestListMatchesTable(t *testing.T) {
	b := NewBuiltins()
	var pods, roles, widgets [][]byte
	for i := range 150 {
		p := samplePod(fmt.Sprintf("pod-%03d", i))
		// Characters encoding/json escapes (HTML-safe) in cells and objects.
		p.Labels["note"] = "a<b>&c"
		p.Annotations = map[string]string{"x": "\u2028 \"quoted\" <tag>"}
		if i%3 == 0 {
			p.Status = corev1.PodStatus{Phase: corev1.PodPending, Reason: "Evicted"}
		}
		pods = append(pods, mustJSON(t, p))
		roles = append(roles, mustJSON(t, &rbacv1.Role{TypeMeta: metav1.TypeMeta{Kind: "Role", APIVersion: "rbac.authorization.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("r-%03d", i), Namespace: "ns", CreationTimestamp: created, ResourceVersion: "5"}}))
		widgets = append(widgets, []byte(fmt.Sprintf(`{"apiVersion":"example.cachetier.io/v1","kind":"Widget","metadata":{"name":"w-%03d","namespace":"ns","resourceVersion":"3","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"color":"<red>","size":%d,"ratio":0.5}}`, i, i)))
	}
	apiservices := [][]byte{
		[]byte(`{"kind":"APIService","apiVersion":"apiregistration.k8s.io/v1","metadata":{"name":"v1.","resourceVersion":"4","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"version":"v1","groupPriorityMinimum":18000,"versionPriority":1},"status":{"conditions":[{"type":"Available","status":"True","lastTransitionTime":"2020-01-02T03:04:05Z","reason":"Local","message":"Local APIServices are always available"}]}}`),
		[]byte(`{"kind":"APIService","apiVersion":"apiregistration.k8s.io/v1","metadata":{"name":"v1alpha1.x.example.io","resourceVersion":"5","creationTimestamp":"2020-01-02T03:04:05Z"},"spec":{"group":"x.example.io","version":"v1alpha1","service":{"namespace":"ns","name":"svc","port":443},"groupPriorityMinimum":100,"versionPriority":10},"status":{"conditions":[{"type":"Available","status":"False","lastTransitionTime":"2020-01-02T03:04:05Z","reason":"MissingEndpoints","message":"no endpoints"}]}}`),
	}
	cases := []struct {
		name  string
		p     Printer
		items [][]byte
	}{
		{"pods", b.For(podsGVR, "Pod"), pods},
		{"roles (default convertor)", b.For(schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, "Role"), roles},
		{"apiservices", b.For(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}, "APIService"), apiservices},
		{"widgets (custom)", NewCustom(schema.GroupResource{Group: "example.cachetier.io", Resource: "widgets"}, "v1", widgetCRD(
			apiextensionsv1.CustomResourceColumnDefinition{Name: "Color", Type: "string", JSONPath: ".spec.color"},
			apiextensionsv1.CustomResourceColumnDefinition{Name: "Size", Type: "integer", JSONPath: ".spec.size", Priority: 1},
		)), widgets},
	}
	metas := []metav1.ListMeta{{ResourceVersion: "77"}, {ResourceVersion: "77", Continue: "tok", RemainingItemCount: ptr(int64(5))}}
	for _, c := range cases {
		for _, gv := range []schema.GroupVersion{metav1.SchemeGroupVersion, metav1beta1.SchemeGroupVersion} {
			for _, include := range []metav1.IncludeObjectPolicy{"", metav1.IncludeNone, metav1.IncludeMetadata, metav1.IncludeObject} {
				for _, noHeaders := range []bool{false, true} {
					opts := Options{TableOptions: metav1.TableOptions{IncludeObject: include, NoHeaders: noHeaders}, GroupVersion: gv}
					for mi, meta := range metas {
						for _, items := range [][][]byte{nil, c.items[:1], c.items} {
							whole, err := c.p.Table(items, true, meta, opts)
							if err != nil {
								t.Fatal(err)
							}
							want, err := json.Marshal(whole)
							if err != nil {
								t.Fatal(err)
							}
							for _, sizes := range [][]int{{ListBatch}, {1}, {3, 1, 7}} {
								l, ok, err := NewList(c.p, meta, opts)
								if err != nil || !ok {
									t.Fatalf("%s: NewList: %v %v", c.name, ok, err)
								}
								if got := writeList(t, l, items, sizes); !bytes.Equal(got, want) {
									t.Fatalf("%s %s include=%q noHeaders=%v meta %d, %d items in batches %v:\n got %s\nwant %s",
										c.name, gv, include, noHeaders, mi, len(items), sizes, got, want)
								}
								// A page's rows written before its metadata is
								// known: the head comes after, from HeadFor.
								l, _, err = NewList(c.p, metav1.ListMeta{}, opts)
								if err != nil {
									t.Fatal(err)
								}
								rows := writeList(t, l, items, sizes)[len(l.Head()):]
								head, err := l.HeadFor(meta)
								if err != nil {
									t.Fatal(err)
								}
								if got := append(head, rows...); !bytes.Equal(got, want) {
									t.Fatalf("%s %s include=%q noHeaders=%v meta %d, %d items in batches %v, head after the rows:\n got %s\nwant %s",
										c.name, gv, include, noHeaders, mi, len(items), sizes, got, want)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestListAcrossItems: the printers whose rows depend on each other are
// built whole (NewList says so), and they are exactly the apiserver's
// list printers that are not a loop printing each item in order — read
// from the printers' source at the version in go.mod, so an upgrade that
// adds one fails here instead of printing wrong rows.
func TestListAcrossItems(t *testing.T) {
	b := NewBuiltins()
	for gr := range acrossItems {
		p := b.For(gr.WithVersion("v1"), map[string]string{"flowschemas": "FlowSchema", "storageclasses": "StorageClass"}[gr.Resource])
		if _, ok := p.(*builtin); !ok {
			t.Fatalf("%s: printer %T, want the printers", gr, p)
		}
		if l, ok, err := NewList(p, metav1.ListMeta{}, v1Opts); l != nil || ok || err != nil {
			t.Errorf("%s: NewList %v %v %v, want whole", gr, l, ok, err)
		}
	}

	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "k8s.io/kubernetes/pkg/printers/internalversion").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join(strings.TrimSpace(string(out)), "printers.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var across []string
	lists := 0
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || !strings.HasPrefix(fn.Name.Name, "print") || !strings.HasSuffix(fn.Name.Name, "List") || fn.Body == nil {
			continue
		}
		lists++
		if !itemwise(fn) {
			across = append(across, fn.Name.Name)
		}
	}
	sort.Strings(across)
	if lists < 50 || strings.Join(across, ",") != "printFlowSchemaList,printStorageClassList" {
		t.Errorf("%d list printers; not item by item: %v (update acrossItems)", lists, across)
	}
}

// itemwise reports whether a list printer is the plain loop: rows := make,
// for i := range l.Items { r, err := printX(&l.Items[i], options); if err
// != nil {...}; rows = append(rows, r...) }, return rows, nil.
func itemwise(fn *ast.FuncDecl) bool {
	stmts := fn.Body.List
	if len(stmts) != 3 {
		return false
	}
	loop, ok := stmts[1].(*ast.RangeStmt)
	if !ok || len(loop.Body.List) != 3 {
		return false
	}
	assign, ok := loop.Body.List[0].(*ast.AssignStmt)
	if !ok || len(assign.Rhs) != 1 {
		return false
	}
	call, ok := assign.Rhs[0].(*ast.CallExpr)
	if !ok || len(call.Args) != 2 {
		return false
	}
	addr, ok := call.Args[0].(*ast.UnaryExpr)
	if !ok || addr.Op != token.AND {
		return false
	}
	idx, ok := addr.X.(*ast.IndexExpr)
	if !ok {
		return false
	}
	sel, ok := idx.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Items"
}

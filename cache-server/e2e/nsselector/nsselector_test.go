// Package nsselector tests a profile's namespaceSelector and labelSelector
// end to end: only objects in matching namespaces (with matching labels)
// are cached and served, and relabelling a namespace (an object) moves its
// objects (it) in and out of the cache — for LISTs and for watchers (an
// informer on each tier follows every move), on the standalone tier and on
// a fleet of two shards behind a front, side by side.
package nsselector

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

var apiserver kubernetes.Interface

// tiers are the standalone tier and the fleet, read side by side.
var tiers []tierClient

type tierClient struct {
	name string
	kc   kubernetes.Interface
}

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		ServiceClusterIPRange: "127.81.0.0/24",
		Spec: v1alpha1.CacheProfileSpec{
			HashShards: 2,
			Resources: []v1alpha1.CachedResource{
				{Version: "v1", Resource: "configmaps", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}},
				// As config/samples filters Certificates: a set-based
				// expression, which a selector's String form must carry.
				{Version: "v1", Resource: "secrets", LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "skip", Operator: metav1.LabelSelectorOpDoesNotExist},
					{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}},
				}}},
			},
		},
		Seed:        seed,
		FleetShards: 2,
	}, func(e *tiertest.Env) {
		apiserver = kubernetes.NewForConfigOrDie(e.Admin)
		tiers = []tierClient{
			{"standalone", kubernetes.NewForConfigOrDie(e.TierAdmin)},
			{"fleet", kubernetes.NewForConfigOrDie(e.FleetAdmin)},
		}
	}))
}

func seed(ctx context.Context, admin *rest.Config) error {
	kc, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	for ns, team := range map[string]string{"sel-a": "x", "sel-b": "y"} {
		if err := createNamespace(ctx, kc, ns, team, 5); err != nil {
			return err
		}
	}
	for i, labels := range []map[string]string{{"tier": "a"}, {"tier": "b"}, {"tier": "c"}, {"tier": "a", "skip": "1"}, {}} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s-%d", i), Labels: labels}, StringData: map[string]string{"i": fmt.Sprint(i)}}
		if _, err := kc.CoreV1().Secrets("sel-b").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// labelSelector is the secrets resource's selector, as a LIST parameter.
const labelSelector = "!skip,tier in (a,b)"

// secretKeys lists secrets as namespace/name@rv.
func secretKeys(t *testing.T, kc kubernetes.Interface, selector string) string {
	t.Helper()
	l, err := kc.CoreV1().Secrets("sel-b").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		out = append(out, s.Namespace+"/"+s.Name+"@"+s.ResourceVersion)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestLabelSelector: a resource with a labelSelector holds exactly what the
// apiserver lists with that selector, and objects relabelled into or out of
// it enter and leave the cache.
func TestLabelSelector(t *testing.T) {
	ctx := context.Background()
	check := func(stage string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for _, tc := range tiers {
			for {
				w, g := secretKeys(t, apiserver, labelSelector), secretKeys(t, tc.kc, "")
				if w == g && w != "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s serves\n %s\nwant the apiserver's secrets matching %q:\n %s", stage, tc.name, g, labelSelector, w)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	check("initial")
	patch := func(name, labels string) {
		t.Helper()
		if _, err := apiserver.CoreV1().Secrets("sel-b").Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":`+labels+`}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch("s-3", `{"skip":null}`) // enters
	check("after s-3 lost its skip label")
	patch("s-0", `{"tier":"c"}`) // leaves
	check("after s-0 moved to tier c")
	patch("s-4", `{"tier":"b"}`) // enters
	check("after s-4 got tier b")
}

func createNamespace(ctx context.Context, kc kubernetes.Interface, ns, team string, configMaps int) error {
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": team}}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for i := range configMaps {
		if _, err := kc.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}, Data: map[string]string{"i": fmt.Sprint(i)}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// want is the apiserver's configmaps in the given namespaces.
func want(t *testing.T, namespaces ...string) string {
	t.Helper()
	l, err := apiserver.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]bool{}
	for _, ns := range namespaces {
		in[ns] = true
	}
	var out []string
	for _, cm := range l.Items {
		if in[cm.Namespace] {
			out = append(out, cm.Namespace+"/"+cm.Name+"@"+cm.ResourceVersion)
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// got is a consistent LIST of configmaps from a tier.
func got(t *testing.T, tier kubernetes.Interface) string {
	t.Helper()
	l, err := tier.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var items []any
	for i := range l.Items {
		items = append(items, &l.Items[i])
	}
	return keysOf(items)
}

func keysOf(items []any) string {
	var out []string
	for _, o := range items {
		cm := o.(*corev1.ConfigMap)
		out = append(out, cm.Namespace+"/"+cm.Name+"@"+cm.ResourceVersion)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// informers watch each tier for the whole test: relabels must reach
// watchers as events, not only LISTs.
var informers []cache.SharedIndexInformer

func startInformers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	informers = nil
	for _, tc := range tiers {
		f := kinformers.NewSharedInformerFactory(tc.kc, 0)
		inf := f.Core().V1().ConfigMaps().Informer()
		f.Start(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatalf("%s informer did not sync", tc.name)
		}
		informers = append(informers, inf)
	}
}

// eventually polls until every tier serves exactly the configmaps of the
// given namespaces, in LISTs and in its informer's store (membership
// changes are asynchronous to the relabel).
func eventually(t *testing.T, namespaces ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i, tc := range tiers {
		for {
			w, g := want(t, namespaces...), got(t, tc.kc)
			gi := keysOf(informers[i].GetStore().List())
			if w == g && w == gi {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s serves\n %s\nits informer holds\n %s\nwant the configmaps of %v:\n %s", tc.name, g, gi, namespaces, w)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func relabel(t *testing.T, ns, team string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"team":%q}}}`, team)
	if _, err := apiserver.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestNamespaceSelector(t *testing.T) {
	ctx := context.Background()
	startInformers(t)
	// Only sel-a matches at start-up: kube-system, default and sel-b are
	// neither cached nor served.
	for _, tc := range tiers {
		if w, g := want(t, "sel-a"), got(t, tc.kc); w != g || w == "" {
			t.Fatalf("initial: %s serves\n %s\nwant\n %s", tc.name, g, w)
		}
		if _, err := tc.kc.CoreV1().ConfigMaps("sel-b").Get(ctx, "cm-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s: GET of a configmap outside the selector: %v, want NotFound", tc.name, err)
		}
		if l, err := tc.kc.CoreV1().ConfigMaps("sel-b").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
			t.Fatalf("%s: LIST of a namespace outside the selector: %v %v", tc.name, l, err)
		}
	}
	eventually(t, "sel-a")

	// Live changes follow the selector too.
	if _, err := apiserver.CoreV1().ConfigMaps("sel-b").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := apiserver.CoreV1().ConfigMaps("sel-a").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sel-a")

	// sel-b starts matching: its objects, including the one created while
	// it did not match, enter the cache.
	relabel(t, "sel-b", "x")
	eventually(t, "sel-a", "sel-b")
	for _, tc := range tiers {
		if cm, err := tc.kc.CoreV1().ConfigMaps("sel-b").Get(ctx, "late", metav1.GetOptions{}); err != nil || cm.Name != "late" {
			t.Fatalf("%s: GET after the namespace entered: %v %v", tc.name, cm, err)
		}
	}
	// A change right after entering is served.
	if err := apiserver.CoreV1().ConfigMaps("sel-b").Delete(ctx, "cm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sel-a", "sel-b")

	// sel-a stops matching: its objects leave.
	relabel(t, "sel-a", "y")
	eventually(t, "sel-b")
	for _, tc := range tiers {
		if _, err := tc.kc.CoreV1().ConfigMaps("sel-a").Get(ctx, "cm-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s: GET after the namespace left: %v, want NotFound", tc.name, err)
		}
	}

	// A new matching namespace with objects.
	if err := createNamespace(ctx, apiserver, "sel-c", "x", 3); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sel-b", "sel-c")

	// Deleting a namespace's label and putting it back.
	relabel(t, "sel-c", "y")
	eventually(t, "sel-b")
	relabel(t, "sel-c", "x")
	eventually(t, "sel-b", "sel-c")
}

// Package nsselector tests a profile's namespaceSelector end to end: only
// objects in matching namespaces are cached and served, and relabelling a
// namespace moves its objects in and out of the cache.
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

var apiserver, tier kubernetes.Interface

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		ServiceClusterIPRange: "127.81.0.0/24",
		Spec: v1alpha1.CacheProfileSpec{
			HashShards: 2,
			Resources: []v1alpha1.CachedResource{
				{Version: "v1", Resource: "configmaps", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}},
			},
		},
		Seed: seed,
	}, func(e *tiertest.Env) {
		apiserver = kubernetes.NewForConfigOrDie(e.Admin)
		tier = kubernetes.NewForConfigOrDie(e.TierAdmin)
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
	return nil
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

// got is a consistent LIST of configmaps from the tier.
func got(t *testing.T) string {
	t.Helper()
	l, err := tier.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, cm := range l.Items {
		out = append(out, cm.Namespace+"/"+cm.Name+"@"+cm.ResourceVersion)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// eventually polls until the tier serves exactly the configmaps of the
// given namespaces (membership changes are asynchronous to the relabel).
func eventually(t *testing.T, namespaces ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		w, g := want(t, namespaces...), got(t)
		if w == g {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tier serves\n %s\nwant the configmaps of %v:\n %s", g, namespaces, w)
		}
		time.Sleep(100 * time.Millisecond)
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
	// Only sel-a matches at start-up: kube-system, default and sel-b are
	// neither cached nor served.
	if w, g := want(t, "sel-a"), got(t); w != g || w == "" {
		t.Fatalf("initial: tier serves\n %s\nwant\n %s", g, w)
	}
	if _, err := tier.CoreV1().ConfigMaps("sel-b").Get(ctx, "cm-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("GET of a configmap outside the selector: %v, want NotFound", err)
	}
	if l, err := tier.CoreV1().ConfigMaps("sel-b").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Fatalf("LIST of a namespace outside the selector: %v %v", l, err)
	}

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
	if cm, err := tier.CoreV1().ConfigMaps("sel-b").Get(ctx, "late", metav1.GetOptions{}); err != nil || cm.Name != "late" {
		t.Fatalf("GET after the namespace entered: %v %v", cm, err)
	}
	// A change right after entering is served.
	if err := apiserver.CoreV1().ConfigMaps("sel-b").Delete(ctx, "cm-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "sel-a", "sel-b")

	// sel-a stops matching: its objects leave.
	relabel(t, "sel-a", "y")
	eventually(t, "sel-b")
	if _, err := tier.CoreV1().ConfigMaps("sel-a").Get(ctx, "cm-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("GET after the namespace left: %v, want NotFound", err)
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

package kubectl

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestAggregatedAdmin: kubectl with a kubeconfig whose server URL is
// https://<apiserver>/apis/agg.cache.cachetier.io/v1alpha1/watch (what
// status.serverURL holds) reaches the tier process through the real
// aggregator and answers as the apiserver does; so does the server URL of
// the first releases, without /watch.
func TestAggregatedAdmin(t *testing.T) {
	if !strings.HasSuffix(aggURL(t, aggKubeconfig), "/apis/"+aggProfile+".cache.cachetier.io/v1alpha1/watch") {
		t.Fatalf("aggregated kubeconfig server URL does not end in the profile's prefix")
	}
	for _, c := range getCases {
		t.Run(c.name, func(t *testing.T) {
			compareJSON(t, aggKubeconfig, c.args...)
		})
	}
	t.Run("chunked", func(t *testing.T) {
		args := []string{"get", "configmaps", "-A", "--chunk-size=50", "-o", "name", "-v=6"}
		r := kubectl(t, aggKubeconfig, args...)
		if r.err != nil {
			t.Fatalf("kubectl: %s", r)
		}
		want := mustKubectl(t, env.CP.AdminKubeconfig, args[:len(args)-1]...)
		if r.stdout != want {
			t.Fatalf("output differs from the apiserver's:\n%s\nwant:\n%s", clip(r.stdout), clip(want))
		}
		n := 0
		for _, m := range pageRequest.FindAllStringSubmatch(r.stderr, -1) {
			if !strings.Contains(m[0], "/apis/"+aggProfile+".cache.cachetier.io/v1alpha1/watch/api/v1/configmaps?") {
				t.Fatalf("page request not under the aggregated prefix: %s", m[0])
			}
			n++
		}
		if n < 20 {
			t.Fatalf("%d page requests through the aggregator, want >= 20", n)
		}
	})
	t.Run("writes refused", func(t *testing.T) {
		r := kubectl(t, aggKubeconfig, "delete", "configmap", "cm-000", "-n", "ns-0")
		if r.err == nil || !strings.Contains(r.stderr, "cachetier serves a read-only cache") {
			t.Fatalf("want the tier's read-only refusal through the aggregator, got %s", r)
		}
	})
	// Existing kubeconfigs keep working (their watches are cut at the
	// apiserver's request timeout: TestWatchOutlivesRequestTimeout).
	t.Run("server URL without /watch", func(t *testing.T) {
		root := filepath.Join(env.CP.Dir, "kubeconfig-admin-aggregated-root")
		noErr(t, agg.RootKubeconfig(env.CP.AdminKubeconfig, root))
		if !strings.HasSuffix(aggURL(t, root), "/apis/"+aggProfile+".cache.cachetier.io/v1alpha1") {
			t.Fatalf("root kubeconfig server URL %s", aggURL(t, root))
		}
		for _, c := range getCases {
			t.Run(c.name, func(t *testing.T) {
				compareJSON(t, root, c.args...)
			})
		}
	})
}

// TestAggregatedRBAC: a non-admin user reads through the aggregator exactly
// what RBAC lets them read from the apiserver, and gets the same 403 for the
// rest (decided by the tier's SubjectAccessReview). The aggregator first
// authorizes the aggregated path itself: below status.serverURL's prefix as
// verb watch on resource "api" of the profile's group, so the user also
// needs watch on that group (and nothing more of it).
func TestAggregatedRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	group := aggProfile + ".cache.cachetier.io"
	create := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := kc.RbacV1().Roles("ns-1").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "configmap-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	create(err)
	for _, user := range []string{"carol", "dave"} {
		_, err = kc.RbacV1().RoleBindings("ns-1").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "configmap-reader-" + user},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		}, metav1.CreateOptions{})
		create(err)
	}
	// Only carol may use the aggregated path, with the one verb the
	// apiserver checks for it.
	_, err = kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "cachetier-" + aggProfile + "-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: []string{"*"}, Verbs: []string{"watch"}}},
	}, metav1.CreateOptions{})
	create(err)
	_, err = kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cachetier-" + aggProfile + "-reader-carol"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cachetier-" + aggProfile + "-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "carol"}},
	}, metav1.CreateOptions{})
	create(err)

	carolDirect, err := env.CP.UserKubeconfig("carol", "developers")
	create(err)
	carolAgg := filepath.Join(env.CP.Dir, "kubeconfig-carol-aggregated")
	create(agg.AggregatedKubeconfig(carolDirect, carolAgg))
	daveDirect, err := env.CP.UserKubeconfig("dave", "developers")
	create(err)
	daveAgg := filepath.Join(env.CP.Dir, "kubeconfig-dave-aggregated")
	create(agg.AggregatedKubeconfig(daveDirect, daveAgg))

	// RBAC changes reach the authorizer's cache within moments; wait until
	// carol can read through the aggregator.
	allowed := []string{"get", "configmaps", "-n", "ns-1", "-o", "name"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := kubectl(t, carolAgg, allowed...)
		if r.err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("carol cannot read ns-1 configmaps through the aggregator: %s", r)
		}
		time.Sleep(500 * time.Millisecond)
	}

	same := func(t *testing.T, args []string, wantErr bool) {
		t.Helper()
		want := kubectl(t, carolDirect, args...)
		got := kubectl(t, carolAgg, args...)
		if (want.err != nil) != wantErr {
			t.Fatalf("apiserver: want error %v: %s", wantErr, want)
		}
		if (got.err != nil) != wantErr || got.stdout != want.stdout || got.stderr != want.stderr {
			t.Fatalf("through the tier:\n%s\napiserver:\n%s", got, want)
		}
		t.Logf("carol: kubectl %s -> %s", strings.Join(args, " "), strings.TrimSpace(clip(got.stdout+got.stderr)))
	}
	t.Run("allowed", func(t *testing.T) {
		for _, args := range [][]string{
			allowed,
			{"get", "configmaps", "-n", "ns-1", "-o", "json"},
			{"get", "configmaps", "-n", "ns-1", "-l", "app=a", "-o", "name"},
			{"get", "configmaps", "-n", "ns-1", "--chunk-size=50", "-o", "name"},
			{"get", "configmap", "cm-042", "-n", "ns-1", "-o", "json"},
		} {
			same(t, args, false)
		}
	})
	t.Run("forbidden", func(t *testing.T) {
		for _, args := range [][]string{
			{"get", "configmaps", "-n", "ns-2", "-o", "name"},
			{"get", "configmap", "cm-042", "-n", "ns-2", "-o", "name"},
			{"get", "configmaps", "-A", "-o", "name"},
			{"get", "pods", "-A", "-o", "name"},
			{"get", "secrets", "-n", "ns-1", "-o", "name"},
			{"get", "secret", "secret-01", "-n", "ns-1", "-o", "name"},
			{"get", "wg", "-n", "ns-1", "-o", "name"},
		} {
			same(t, args, true)
		}
	})
	t.Run("no RBAC on the aggregated group", func(t *testing.T) {
		// dave may read ns-1 configmaps from the apiserver, but the
		// aggregator refuses the aggregated path before the tier sees it.
		mustKubectl(t, daveDirect, allowed...)
		r := kubectl(t, daveAgg, allowed...)
		if r.err == nil || !strings.Contains(r.stderr, "Forbidden") && !strings.Contains(r.stderr, "forbidden") {
			t.Fatalf("dave through the aggregator: want forbidden, got %s", r)
		}
		t.Logf("dave: %s", strings.TrimSpace(r.stderr))
	})
	t.Run("the group-version's own path needs get and list", func(t *testing.T) {
		// Below it the apiserver sees get (list for /api, /apis) of
		// resource api: carol's watch does not open it. (--raw: kubectl's
		// discovery prints such a 403 as "unknown".)
		carolRoot := filepath.Join(env.CP.Dir, "kubeconfig-carol-aggregated-root")
		create(agg.RootKubeconfig(carolDirect, carolRoot))
		r := kubectl(t, carolRoot, "get", "--raw", "/api/v1/namespaces/ns-1/configmaps")
		if r.err == nil || !strings.Contains(r.stderr, `cannot get resource "api/namespaces" in API group "`+group+`"`) {
			t.Fatalf("carol below the group-version's path: want the apiserver's 403 for get of api/namespaces, got %s", r)
		}
		t.Logf("carol (watch only) below the group-version's path: %s", strings.TrimSpace(r.stderr))
	})
}

func aggURL(t *testing.T, kubeconfig string) string {
	t.Helper()
	out := mustKubectl(t, kubeconfig, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	return strings.TrimSpace(out)
}

// The tier process serves Go's profiles (--profiling, on by default as in
// kube-apiserver) behind the same authorization as the apiserver's own
// /debug/pprof: the admin reads them, a user without a nonResourceURLs rule
// gets the apiserver's 403, word for word.
func TestProfilingAuthorized(t *testing.T) {
	adminDirect := filepath.Join(env.CP.Dir, "kubeconfig-admin-direct-pprof")
	if err := agg.DirectKubeconfig(env.CP.AdminKubeconfig, adminDirect); err != nil {
		t.Fatal(err)
	}
	if out := mustKubectl(t, adminDirect, "get", "--raw", "/debug/pprof/cmdline"); !strings.Contains(out, "cache-server") {
		t.Fatalf("admin /debug/pprof/cmdline: %q", clip(out))
	}
	erin, err := env.CP.UserKubeconfig("erin", "developers")
	if err != nil {
		t.Fatal(err)
	}
	erinDirect := filepath.Join(env.CP.Dir, "kubeconfig-erin-direct")
	if err := agg.DirectKubeconfig(erin, erinDirect); err != nil {
		t.Fatal(err)
	}
	want := kubectl(t, erin, "get", "--raw", "/debug/pprof/cmdline")
	got := kubectl(t, erinDirect, "get", "--raw", "/debug/pprof/cmdline")
	if want.err == nil || !strings.Contains(want.stderr, "Forbidden") {
		t.Fatalf("apiserver: want Forbidden: %s", want)
	}
	if got.err == nil || got.stderr != want.stderr {
		t.Fatalf("tier:\n%s\napiserver:\n%s", got, want)
	}
	t.Logf("erin: %s", strings.TrimSpace(got.stderr))
}

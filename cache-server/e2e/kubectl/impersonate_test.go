package kubectl

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// impersonationPaths are the kubeconfigs of one caller: the apiserver, and
// the tier by every way there is to it: the in-process standalone tier,
// the standalone and fleet-front processes directly, and both through the
// aggregator.
type impersonationPaths struct {
	name      string
	apiserver string
	direct    map[string]string // path -> kubeconfig, straight to a tier endpoint
	viaAgg    map[string]string // path -> kubeconfig, through the aggregator
}

// all returns every path to the tier, or only the direct ones.
func (p impersonationPaths) all(directOnly bool) map[string]string {
	out := map[string]string{}
	for k, v := range p.direct {
		out[k] = v
	}
	if !directOnly {
		for k, v := range p.viaAgg {
			out[k] = v
		}
	}
	return out
}

// TestImpersonation: kubectl --as/--as-group/--as-uid through the tier
// answers as the apiserver does — directly to the tier's endpoint (the
// tier's own impersonation filter decides) and through the aggregator
// (the apiserver impersonates and forwards only the resulting identity):
// the impersonated user's objects, their 403s, and the apiserver's 403 for
// an impersonation the caller may not do, word for word.
func TestImpersonation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	rules := func(r ...rbacv1.PolicyRule) []rbacv1.PolicyRule { return r }
	role := func(name string, r []rbacv1.PolicyRule, subjects ...rbacv1.Subject) {
		_, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: r}, metav1.CreateOptions{})
		noErr(t, err)
		_, err = kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   subjects,
		}, metav1.CreateOptions{})
		noErr(t, err)
	}
	userSubject := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
	}
	groupSubject := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "imp-readers"}

	// frank (and group imp-readers) may read configmaps of ns-1 only, and
	// use the aggregated paths of both tier processes.
	_, err := kc.RbacV1().Roles("ns-1").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "imp-configmap-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	noErr(t, err)
	_, err = kc.RbacV1().RoleBindings("ns-1").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "imp-configmap-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "imp-configmap-reader"},
		Subjects:   []rbacv1.Subject{userSubject("frank"), groupSubject},
	}, metav1.CreateOptions{})
	noErr(t, err)
	role("imp-tier-paths", rules(rbacv1.PolicyRule{
		APIGroups: []string{aggProfile + ".cache.cachetier.io", fleetProfile + ".cache.cachetier.io"},
		Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"},
	}), userSubject("frank"), groupSubject, userSubject("gina"), userSubject("henry"))
	// henry may impersonate the user frank and nothing else (no groups, no
	// UIDs, no other user); gina may not impersonate at all.
	role("imp-henry", rules(rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"users"}, ResourceNames: []string{"frank"}, Verbs: []string{"impersonate"},
	}), userSubject("henry"))

	admin := userPaths(t, "admin", env.CP.AdminKubeconfig)
	gina := userPaths(t, "gina", "")
	henry := userPaths(t, "henry", "")

	// RBAC reaches the authorizers' caches (the apiserver's and the tier's
	// SubjectAccessReview cache) within moments.
	waitAllowed := func(p impersonationPaths, args ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for _, kubeconfig := range append(slices.Collect(maps.Values(p.all(false))), p.apiserver) {
			for {
				r := kubectl(t, kubeconfig, args...)
				if r.err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: kubectl %s never allowed: %s", p.name, strings.Join(args, " "), r)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
	waitAllowed(admin, "get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank")
	waitAllowed(henry, "get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank")

	forbidden := func() float64 {
		v, err := env.Metric(`cachetier_impersonation_requests_total{result="forbidden"}`)
		noErr(t, err)
		f, _ := strconv.ParseFloat(v, 64) // absent before the first: 0
		return f
	}
	forbiddenBefore := forbidden()

	same := func(t *testing.T, p impersonationPaths, wantErr, directOnly bool, args ...string) {
		t.Helper()
		want := kubectl(t, p.apiserver, args...)
		if (want.err != nil) != wantErr {
			t.Fatalf("apiserver: want error %v: %s", wantErr, want)
		}
		if !wantErr && strings.TrimSpace(want.stdout) == "" {
			t.Fatalf("apiserver printed nothing; the case tests nothing: %s", want)
		}
		for path, kubeconfig := range p.all(directOnly) {
			got := kubectl(t, kubeconfig, args...)
			if (got.err != nil) != wantErr || got.stdout != want.stdout || withoutKlogHeaders(got.stderr) != withoutKlogHeaders(want.stderr) {
				t.Errorf("%s through the tier (%s):\n%s\napiserver:\n%s", p.name, path, got, want)
			}
		}
		t.Logf("%s: kubectl %s -> %s", p.name, strings.Join(args, " "), strings.TrimSpace(clip(want.stdout+want.stderr)))
	}
	// kubectl prints a refused impersonation as "Forbidden: unknown" (its
	// discovery requests are refused first); the --raw cases show the
	// Status message, TestImpersonationStatus the whole Status.
	cases := []struct {
		name    string
		caller  impersonationPaths
		wantErr bool
		args    []string
	}{
		{"as frank: allowed list", admin, false, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank"}},
		{"as frank: allowed json", admin, false, []string{"get", "configmaps", "-n", "ns-1", "-l", "app=a", "-o", "json", "--as=frank"}},
		{"as frank: allowed get", admin, false, []string{"get", "configmap", "cm-042", "-n", "ns-1", "-o", "yaml", "--as=frank"}},
		{"as frank: other namespace", admin, true, []string{"get", "configmaps", "-n", "ns-2", "-o", "name", "--as=frank"}},
		{"as frank: all namespaces", admin, true, []string{"get", "configmaps", "-A", "-o", "name", "--as=frank"}},
		{"as frank: pods", admin, true, []string{"get", "pods", "-A", "-o", "name", "--as=frank"}},
		{"as frank: secrets", admin, true, []string{"get", "secret", "secret-01", "-n", "ns-1", "-o", "name", "--as=frank"}},
		{"as frank: widgets", admin, true, []string{"get", "wg", "-n", "ns-1", "-o", "name", "--as=frank"}},
		// kubectl wait reads with a watch-list: a long-running impersonated request.
		{"as frank: wait", admin, false, []string{"wait", "--for=jsonpath={.data.index}=42", "configmap/cm-042", "-n", "ns-1", "--as=frank", "--timeout=20s"}},
		{"as frank with uid", admin, false, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank", "--as-uid=frank-uid-1"}},
		{"as group imp-readers", admin, false, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=nobody", "--as-group=imp-readers"}},
		{"as group imp-readers: other namespace", admin, true, []string{"get", "configmaps", "-n", "ns-3", "-o", "name", "--as=nobody", "--as-group=imp-readers"}},
		{"gina may not impersonate", gina, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank"}},
		{"gina may not impersonate a group", gina, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=gina", "--as-group=imp-readers"}},
		{"henry as frank", henry, false, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank"}},
		{"henry as frank: other namespace", henry, true, []string{"get", "configmaps", "-n", "ns-2", "-o", "name", "--as=frank"}},
		{"henry as another user", henry, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=ivan"}},
		{"henry as frank with a group", henry, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank", "--as-group=imp-readers"}},
		{"henry as frank with a uid", henry, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank", "--as-uid=frank-uid-1"}},
		{"henry as frank with an extra", henry, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name", "--as=frank", "--as-user-extra=scopes=view"}},
		{"henry without impersonation", henry, true, []string{"get", "configmaps", "-n", "ns-1", "-o", "name"}},
		{"raw: henry as frank", henry, false, []string{"get", "--raw", "/api/v1/namespaces/ns-1/configmaps/cm-042", "--as=frank"}},
		{"raw: henry as frank with a uid", henry, true, []string{"get", "--raw", "/api/v1/namespaces/ns-1/configmaps", "--as=frank", "--as-uid=u1"}},
		{"raw: henry as frank with a group", henry, true, []string{"get", "--raw", "/api/v1/namespaces/ns-1/configmaps", "--as=frank", "--as-group=g1"}},
		{"raw: henry as frank with an extra", henry, true, []string{"get", "--raw", "/api/v1/namespaces/ns-1/configmaps", "--as=frank", "--as-user-extra=scopes=view"}},
		{"raw: henry as another user", henry, true, []string{"get", "--raw", "/api/v1/namespaces/ns-1/configmaps", "--as=ivan"}},
		{"raw: as frank, secrets", admin, true, []string{"get", "--raw", "/api/v1/namespaces/ns-1/secrets", "--as=frank"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { same(t, c.caller, c.wantErr, false, c.args...) })
	}
	// Through the aggregator, "nobody" (no RBAC on the aggregated group) is
	// refused by the aggregator before the tier is asked (see
	// TestAggregatedRBAC); only the direct path reaches the tier.
	t.Run("as nobody without the group", func(t *testing.T) {
		same(t, admin, true, true, "get", "configmaps", "-n", "ns-1", "-o", "name", "--as=nobody")
	})
	// A caller with no impersonate permission at all is refused with the
	// first mode the apiserver tries (constrained impersonation,
	// "impersonate-on:user-info:<verb>" on the request's resource); through
	// the aggregator that resource is the aggregated path, and the
	// apiserver refuses before the tier is asked.
	t.Run("raw: gina may not impersonate", func(t *testing.T) {
		same(t, gina, true, true, "get", "--raw", "/api/v1/namespaces/ns-1/configmaps", "--as=frank")
	})
	// Direct refusals are the tier's own and counted: gina ×3, henry ×8
	// (and kubectl's discovery requests before them).
	if got := forbidden() - forbiddenBefore; got < 11 {
		t.Errorf("cachetier_impersonation_requests_total{result=\"forbidden\"} grew by %v, want >= 11", got)
	}
	statusCases(t, gina, henry)
}

// userPaths writes the kubeconfigs of user (a new client-certificate user
// of the "developers" group, or the apiserver kubeconfig given).
func userPaths(t *testing.T, user, kubeconfig string) impersonationPaths {
	t.Helper()
	if kubeconfig == "" {
		var err error
		if kubeconfig, err = env.CP.UserKubeconfig(user, "developers"); err != nil {
			t.Fatal(err)
		}
	}
	file := func(path string) string { return filepath.Join(env.CP.Dir, "kubeconfig-imp-"+user+"-"+path) }
	p := impersonationPaths{name: user, apiserver: kubeconfig,
		direct: map[string]string{"direct": file("direct"), "process direct": file("process"), "fleet front direct": file("front")},
		viaAgg: map[string]string{"aggregated": file("aggregated"), "fleet": file("fleet")},
	}
	for _, err := range []error{
		controlplane.RewriteKubeconfig(kubeconfig, p.direct["direct"], env.TierURL, env.TierAdmin.CAData, ""),
		agg.DirectKubeconfig(kubeconfig, p.direct["process direct"]),
		fleet.DirectKubeconfig(kubeconfig, p.direct["fleet front direct"]),
		agg.AggregatedKubeconfig(kubeconfig, p.viaAgg["aggregated"]),
		fleet.AggregatedKubeconfig(kubeconfig, p.viaAgg["fleet"]),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// klogHeader is the prefix of kubectl's own log lines (severity, time,
// pid), which differ between any two runs.
var klogHeader = regexp.MustCompile(`(?m)^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ `)

func withoutKlogHeaders(s string) string { return klogHeader.ReplaceAllString(s, "") }

// statusCases: a refused impersonation answers with the apiserver's whole
// Status (code, reason, message, details) on every path, read by client-go.
func statusCases(t *testing.T, gina, henry impersonationPaths) {
	for _, c := range []struct {
		name       string
		caller     impersonationPaths
		as         rest.ImpersonationConfig
		directOnly bool // see "raw: gina may not impersonate"
	}{
		{"gina as frank", gina, rest.ImpersonationConfig{UserName: "frank"}, true},
		{"henry as ivan", henry, rest.ImpersonationConfig{UserName: "ivan"}, false},
		{"henry as frank with a group", henry, rest.ImpersonationConfig{UserName: "frank", Groups: []string{"g1"}}, false},
		{"henry as frank with a uid", henry, rest.ImpersonationConfig{UserName: "frank", UID: "u1"}, false},
		{"henry as frank with an extra", henry, rest.ImpersonationConfig{UserName: "frank", Extra: map[string][]string{"scopes": {"view"}}}, false},
		{"henry as frank, secrets", henry, rest.ImpersonationConfig{UserName: "frank"}, false},
	} {
		t.Run("status "+c.name, func(t *testing.T) {
			list := func(kubeconfig string) metav1.Status {
				t.Helper()
				cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Impersonate = c.as
				kc := kubernetes.NewForConfigOrDie(cfg)
				if strings.HasSuffix(c.name, "secrets") {
					_, err = kc.CoreV1().Secrets("ns-1").List(context.Background(), metav1.ListOptions{})
				} else {
					_, err = kc.CoreV1().ConfigMaps("ns-1").List(context.Background(), metav1.ListOptions{})
				}
				var st apierrors.APIStatus
				if !errors.As(err, &st) {
					t.Fatalf("%s: want a Status error, got %v", kubeconfig, err)
				}
				return st.Status()
			}
			want := list(c.caller.apiserver)
			if want.Code != http.StatusForbidden {
				t.Fatalf("apiserver: %+v", want)
			}
			for _, kubeconfig := range c.caller.all(c.directOnly) {
				if got := list(kubeconfig); !reflect.DeepEqual(got, want) {
					t.Errorf("%s:\n%+v\napiserver:\n%+v", kubeconfig, got, want)
				}
			}
			t.Logf("%d %s: %s", want.Code, want.Reason, want.Message)
		})
	}
}

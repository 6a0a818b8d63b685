package kubectl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// clusterOpenAPI is what the apiserver's own OpenAPI endpoints say.
type clusterOpenAPI struct {
	paths       map[string]json.RawMessage // /openapi/v2 paths
	definitions map[string]json.RawMessage // /openapi/v2 definitions
	v3          map[string]string          // /openapi/v3 discovery: path -> serverRelativeURL
	explainPods string                     // kubectl explain pods
}

// openAPIBefore is the cluster's OpenAPI before any tier registered
// (TestMain), to prove registering one changes nothing but add its group.
var openAPIBefore *clusterOpenAPI

func readClusterOpenAPI(ctx context.Context, admin *rest.Config, kubeconfig string) (*clusterOpenAPI, error) {
	client, err := rest.HTTPClientFor(admin)
	if err != nil {
		return nil, err
	}
	get := func(path string, into any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin.Host+path, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return json.Unmarshal(body, into)
	}
	var v2 struct {
		Paths       map[string]json.RawMessage `json:"paths"`
		Definitions map[string]json.RawMessage `json:"definitions"`
	}
	if err := get("/openapi/v2", &v2); err != nil {
		return nil, err
	}
	var v3 struct {
		Paths map[string]struct {
			URL string `json:"serverRelativeURL"`
		} `json:"paths"`
	}
	if err := get("/openapi/v3", &v3); err != nil {
		return nil, err
	}
	out := &clusterOpenAPI{paths: v2.Paths, definitions: v2.Definitions, v3: map[string]string{}}
	for p, u := range v3.Paths {
		out.v3[p] = u.URL
	}
	cacheDir, err := os.MkdirTemp("", "cachetier-explain-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(cacheDir)
	explain, err := env.CP.RunKubectl(ctx, kubeconfig, "--cache-dir="+cacheDir, "explain", "pods")
	if err != nil {
		return nil, fmt.Errorf("kubectl explain pods: %v: %s", err, explain)
	}
	out.explainPods = string(explain)
	return out, nil
}

// TestOpenAPIAggregatorUnharmed: once the aggregator's OpenAPI controllers
// have loaded the tiers' documents (standalone and fleet), the cluster's
// /openapi/v2 and /openapi/v3 say what they said before, plus each
// profile's group-version; kubectl explain against the apiserver prints
// the same; and the apiserver logged no failed load of a tier's spec (it
// logged "resource not found" every minute while the tier served no
// OpenAPI).
func TestOpenAPIAggregatorUnharmed(t *testing.T) {
	if openAPIBefore == nil {
		t.Fatal("TestMain did not record the cluster's OpenAPI before the tiers registered")
	}
	ctx := context.Background()
	groups := map[string]bool{}
	for _, p := range []string{aggProfile, fleetProfile} {
		groups["apis/"+p+".cache.cachetier.io/v1alpha1"] = true
	}
	var after *clusterOpenAPI
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		if after, err = readClusterOpenAPI(ctx, env.Admin, env.CP.AdminKubeconfig); err != nil {
			t.Fatal(err)
		}
		loaded := 0
		for g := range groups {
			if after.paths["/"+g+"/"] != nil && after.v3[g] != "" {
				loaded++
			}
		}
		if loaded == len(groups) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the aggregator has not loaded the tiers' OpenAPI after 2 minutes; its v3 discovery: %v", slices.Sorted(maps.Keys(after.v3)))
			checkAggregatorLog(t)
			return
		}
		time.Sleep(time.Second)
	}
	checkAggregatorLog(t)

	for p, want := range openAPIBefore.paths {
		if got := after.paths[p]; !jsonEqual(got, want) {
			t.Errorf("/openapi/v2 path %s changed after the tiers registered", p)
		}
	}
	for p := range after.paths {
		if _, ok := openAPIBefore.paths[p]; !ok && !groups[strings.Trim(p, "/")] {
			t.Errorf("/openapi/v2 gained path %s, outside the tiers' groups", p)
		}
	}
	for d, want := range openAPIBefore.definitions {
		if got := after.definitions[d]; !jsonEqual(got, want) {
			t.Errorf("/openapi/v2 definition %s changed after the tiers registered", d)
		}
	}
	for d := range after.definitions {
		if _, ok := openAPIBefore.definitions[d]; !ok {
			t.Errorf("/openapi/v2 gained definition %s (a renamed duplicate?)", d)
		}
	}
	for p, want := range openAPIBefore.v3 {
		if got := after.v3[p]; got != want {
			t.Errorf("/openapi/v3 %s: %s, before the tiers registered %s", p, got, want)
		}
	}
	for p := range after.v3 {
		if _, ok := openAPIBefore.v3[p]; !ok && !groups[p] {
			t.Errorf("/openapi/v3 gained %s, outside the tiers' groups", p)
		}
	}
	if after.explainPods != openAPIBefore.explainPods {
		t.Errorf("kubectl explain pods against the apiserver changed:\n%s\nbefore:\n%s", clip(after.explainPods), clip(openAPIBefore.explainPods))
	}
	// The group's own v3 document, as a client of the apiserver gets it
	// (proxied to the tier).
	for g := range groups {
		doc := mustKubectl(t, env.CP.AdminKubeconfig, "get", "--raw", after.v3[g])
		if !strings.Contains(doc, `"/`+g+`/"`) || !strings.Contains(doc, "APIResourceList") {
			t.Errorf("the apiserver's %s: %s", after.v3[g], clip(doc))
		}
	}
}

// checkAggregatorLog fails for every line of the apiserver's log about a
// failed load of a tier's OpenAPI (kube-aggregator's OpenAPI v2 and v3
// controllers log "loading OpenAPI spec for \"<apiservice>\" failed with").
func checkAggregatorLog(t *testing.T) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(env.CP.Dir, "kube-apiserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "loading OpenAPI spec for") && strings.Contains(line, ".cache.cachetier.io") {
			t.Errorf("the apiserver failed to load a tier's OpenAPI: %s", line)
		}
	}
}

func jsonEqual(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// explainCases run against the apiserver and a tier with identical output.
var explainCases = [][]string{
	{"explain", "pods"},
	{"explain", "pods.spec.containers"},
	{"explain", "pods.spec.containers.resources.claims"},
	{"explain", "configmaps"},
	{"explain", "secrets.data"},
	{"explain", "namespaces", "--api-version=v1"},
	{"explain", "events.involvedObject"},
	{"explain", "widgets"},
	{"explain", "widgets.spec"},
	{"explain", "wg", "--api-version=example.cachetier.io/v1"},
	{"explain", "pods", "--recursive"},
	{"explain", "widgets", "--recursive"},
	{"explain", "pods.spec", "--output=plaintext-openapiv2"},
	{"explain", "widgets", "--output=plaintext-openapiv2"},
}

// tiers are the kubeconfigs of every way a client reaches a tier.
func tiers() []struct{ name, kubeconfig string } {
	return []struct{ name, kubeconfig string }{
		{"direct", env.TierKubeconfig}, {"aggregated", aggKubeconfig}, {"fleet", fleetKubeconfig},
	}
}

// TestExplain: kubectl explain through the tier prints what it prints
// against the apiserver, from OpenAPI v3 (the default) and v2.
func TestExplain(t *testing.T) {
	for _, tier := range tiers() {
		t.Run(tier.name, func(t *testing.T) {
			for _, args := range explainCases {
				t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
					compareOutput(t, tier.kubeconfig, args...)
				})
			}
			t.Run("custom-columns", func(t *testing.T) {
				compareOutput(t, tier.kubeconfig, "get", "pods", "-A", "-o", "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase")
			})
		})
	}
	// The documents themselves are the apiserver's, byte for byte.
	for _, path := range []string{"/openapi/v2", "/openapi/v3/api/v1"} {
		t.Run("raw "+path, func(t *testing.T) {
			if path == "/openapi/v3/api/v1" {
				var d struct {
					Paths map[string]struct {
						URL string `json:"serverRelativeURL"`
					} `json:"paths"`
				}
				if err := json.Unmarshal([]byte(mustKubectl(t, env.TierKubeconfig, "get", "--raw", "/openapi/v3")), &d); err != nil {
					t.Fatal(err)
				}
				path = d.Paths["api/v1"].URL
			}
			compareOutput(t, env.TierKubeconfig, "get", "--raw", path)
		})
	}
}

// TestExplainUncached: a resource the profile does not cache is unknown to
// the tier's discovery, so kubectl explain stops there, as it does for a
// resource the apiserver does not have.
func TestExplainUncached(t *testing.T) {
	for _, tier := range tiers() {
		t.Run(tier.name, func(t *testing.T) {
			r := kubectl(t, tier.kubeconfig, "explain", "deployments")
			if r.err == nil || !strings.Contains(r.stderr, `the server doesn't have a resource type "deployments"`) {
				t.Fatalf("kubectl explain deployments through the tier: %s", r)
			}
		})
	}
}

// TestExplainAsUser: a user with no RBAC beyond the aggregated group (and
// the discovery every authenticated user has) explains through every path;
// the tier authorizes /openapi/* as the non-resource URL it is.
func TestExplainAsUser(t *testing.T) {
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	name := "cachetier-explain-reader"
	var rules []rbacv1.PolicyRule
	for _, p := range []string{aggProfile, fleetProfile} {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{p + ".cache.cachetier.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}})
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	direct, err := env.CP.UserKubeconfig("erin")
	if err != nil {
		t.Fatal(err)
	}
	tierDirect := filepath.Join(env.CP.Dir, "kubeconfig-erin-tier")
	aggregated := filepath.Join(env.CP.Dir, "kubeconfig-erin-aggregated")
	fleetAgg := filepath.Join(env.CP.Dir, "kubeconfig-erin-fleet")
	if err := agg.AggregatedKubeconfig(direct, aggregated); err != nil {
		t.Fatal(err)
	}
	if err := fleet.AggregatedKubeconfig(direct, fleetAgg); err != nil {
		t.Fatal(err)
	}
	if err := userTierKubeconfig(direct, tierDirect); err != nil {
		t.Fatal(err)
	}
	want := mustKubectl(t, direct, "explain", "configmaps")
	for _, kc := range []string{tierDirect, aggregated, fleetAgg} {
		// RBAC reaches the aggregator's authorizer within moments.
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := kubectl(t, kc, "explain", "configmaps")
			if r.err == nil {
				if r.stdout != want {
					t.Fatalf("%s: output differs:\n%s\nwant:\n%s", kc, clip(r.stdout), clip(want))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("erin: kubectl explain configmaps (%s): %s", kc, r)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// userTierKubeconfig writes a kubeconfig for the tier's own endpoint with
// the credentials of the apiserver kubeconfig user.
func userTierKubeconfig(user, out string) error {
	u, err := clientcmd.LoadFromFile(user)
	if err != nil {
		return err
	}
	tier, err := clientcmd.LoadFromFile(env.TierKubeconfig)
	if err != nil {
		return err
	}
	tierCluster := tier.Clusters[tier.Contexts[tier.CurrentContext].Cluster]
	u.Clusters[u.Contexts[u.CurrentContext].Cluster] = tierCluster
	return clientcmd.WriteToFile(*u, out)
}

// TestExplainFollowsCRDChange: a field added to a CRD's schema shows up
// in kubectl explain through every tier within the documents' poll
// interval (10 s) plus the apiserver's own rebuild.
func TestExplainFollowsCRDChange(t *testing.T) {
	ctx := context.Background()
	c := apiextensionsclient.NewForConfigOrDie(env.Admin)
	crds := c.ApiextensionsV1().CustomResourceDefinitions()
	crd, err := crds.Get(ctx, "widgets.example.cachetier.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	original := crd.Spec.DeepCopy()
	t.Cleanup(func() {
		crd, err := crds.Get(ctx, "widgets.example.cachetier.io", metav1.GetOptions{})
		if err == nil {
			crd.Spec = *original
			_, err = crds.Update(ctx, crd, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the widgets CRD: %v", err)
		}
	})
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	spec.Properties["explainProbe"] = apiextensionsv1.JSONSchemaProps{Type: "string", Description: "Added by TestExplainFollowsCRDChange."}
	crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = spec
	if _, err := crds.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	for _, tier := range append(tiers(), struct{ name, kubeconfig string }{"apiserver", env.CP.AdminKubeconfig}) {
		deadline := changed.Add(time.Minute)
		for {
			out := kubectl(t, tier.kubeconfig, "explain", "widgets.spec")
			if strings.Contains(out.stdout, "explainProbe") {
				t.Logf("%s: the new field is explained %s after the CRD update", tier.name, time.Since(changed).Round(100*time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: kubectl explain widgets.spec still lacks the new field a minute after the CRD update: %s", tier.name, out)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, tier := range tiers() {
		compareOutput(t, tier.kubeconfig, "explain", "widgets.spec")
	}
}

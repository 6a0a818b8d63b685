package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// The committed bundle is exactly what `make bundle` generates.
func TestCommittedBundleIsGenerated(t *testing.T) {
	root := repoRoot(t)
	files, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := Diff(root, files); len(diffs) > 0 {
		t.Fatalf("bundle differs from the generator's output, run `make bundle`: %v", diffs)
	}
	// Generation is deterministic.
	again, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for p, b := range files {
		if string(again[p]) != string(b) {
			t.Errorf("%s differs between two generations", p)
		}
	}
}

// The bundle passes operator-framework's default bundle validators (CSV,
// CRD and bundle checks) without errors.
func TestBundleValidates(t *testing.T) {
	b, err := manifests.GetBundleFromDir(filepath.Join(repoRoot(t), "bundle"))
	if err != nil {
		t.Fatal(err)
	}
	objs := append(b.ObjectsToValidate(), b)
	results := validation.DefaultBundleValidators.Validate(objs...)
	if len(results) == 0 {
		t.Fatal("validators returned no results: nothing was validated")
	}
	for _, r := range results {
		for _, e := range r.Errors {
			t.Errorf("%s: %v", r.Name, e)
		}
		for _, w := range r.Warnings {
			t.Logf("warning %s: %v", r.Name, w)
		}
	}
	if b.Package != "cachetier" || !slices.Equal(b.Channels, []string{"alpha"}) {
		t.Errorf("package %q channels %v", b.Package, b.Channels)
	}
}

// What the CSV must carry beyond schema validity.
func TestCSVContent(t *testing.T) {
	b, err := manifests.GetBundleFromDir(filepath.Join(repoRoot(t), "bundle"))
	if err != nil {
		t.Fatal(err)
	}
	csv := b.CSV
	if csv.Spec.MinKubeVersion == "" || csv.Spec.Description == "" || len(csv.Spec.InstallModes) != 4 {
		t.Error("minKubeVersion, description and install modes are required")
	}
	var examples []map[string]any
	if err := json.Unmarshal([]byte(csv.Annotations["alm-examples"]), &examples); err != nil || len(examples) == 0 || examples[0]["kind"] != "CacheProfile" {
		t.Errorf("alm-examples: %v %v", err, csv.Annotations["alm-examples"])
	}
	st := csv.Spec.InstallStrategy.StrategySpec
	if len(st.DeploymentSpecs) != 1 || st.DeploymentSpecs[0].Name != "cachetier-controller-manager" {
		t.Fatalf("deployments: %+v", st.DeploymentSpecs)
	}
	if len(st.Permissions) != 1 || len(st.ClusterPermissions) != 1 ||
		st.Permissions[0].ServiceAccountName != st.DeploymentSpecs[0].Spec.Template.Spec.ServiceAccountName {
		t.Fatalf("permissions must belong to the manager's service account: %+v", st)
	}
	hasRule := func(ruleSet int, group, resource, verb string) bool {
		rules := st.Permissions[0].Rules
		if ruleSet == 1 {
			rules = st.ClusterPermissions[0].Rules
		}
		for _, r := range rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		set                   int
		group, resource, verb string
	}{
		{0, "apps", "statefulsets", "patch"}, {0, "", "secrets", "create"}, {0, "coordination.k8s.io", "leases", "update"},
		{1, "cachetier.io", "cacheprofiles", "watch"}, {1, "apiregistration.k8s.io", "apiservices", "create"},
		{1, "rbac.authorization.k8s.io", "roles", "bind"}, {1, "authentication.k8s.io", "tokenreviews", "create"},
	} {
		if !hasRule(c.set, c.group, c.resource, c.verb) {
			t.Errorf("missing permission %+v", c)
		}
	}
	if hasRule(1, "", "secrets", "get") {
		t.Error("secrets must not be readable cluster-wide")
	}
	if len(csv.Spec.CustomResourceDefinitions.Owned) != 1 || len(csv.Spec.CustomResourceDefinitions.Owned[0].SpecDescriptors) == 0 {
		t.Error("owned CRD with descriptors expected")
	}
	if len(csv.Spec.RelatedImages) != 2 {
		t.Errorf("related images: %+v", csv.Spec.RelatedImages)
	}
}

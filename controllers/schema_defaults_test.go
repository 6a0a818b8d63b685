package controllers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// WithDefaults must give exactly the values the CRD schema defaults to;
// otherwise a profile stored by the apiserver and the operator's view of it
// would disagree.
func TestWithDefaultsMatchesSchemaDefaults(t *testing.T) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), "config", "crd", "bases", "cachetier.io_cacheprofiles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	def := func(path ...string) string {
		s := spec
		for _, p := range path {
			s = s.Properties[p]
		}
		if s.Default == nil {
			t.Fatalf("no schema default for %v", path)
		}
		return strings.Trim(string(s.Default.Raw), `"`)
	}
	d := WithDefaults(&cachev1alpha1.CacheProfile{}).Spec
	for path, want := range map[string]string{
		"hashShards":                             itoa(d.HashShards),
		"shards":                                 itoa(d.Shards),
		"replicasPerShard":                       itoa(d.ReplicasPerShard),
		"frontReplicas":                          itoa(d.FrontReplicas),
		"freshnessTimeout":                       cachev1alpha1.DefaultFreshnessTimeout,
		"historyWindow":                          cachev1alpha1.DefaultHistoryWindow,
		"expose.apiService.enabled":              "true",
		"expose.apiService.groupPriorityMinimum": itoa(d.Expose.APIService.GroupPriorityMinimum),
		"expose.apiService.versionPriority":      itoa(d.Expose.APIService.VersionPriority),
		"expose.service.port":                    itoa(d.Expose.Service.Port),
	} {
		if got := def(strings.Split(path, ".")...); got != want {
			t.Errorf("%s: schema default %s, WithDefaults %s", path, got, want)
		}
	}
	if d.FreshnessTimeout.Duration.String() != "3s" || d.HistoryWindow.Duration.String() != "2m30s" {
		t.Errorf("durations: %s %s", d.FreshnessTimeout, d.HistoryWindow)
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

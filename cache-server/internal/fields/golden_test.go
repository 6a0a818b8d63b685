package fields

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The golden files are produced by kube-apiserver 1.37.1's own code
// (testdata/kubescheme/main.go): legacyscheme's field label conversions and
// the registries' GetAttrs. These tests keep this package byte-compatible
// with them.

var resourceOfKind = map[string]string{
	"Pod": "pods", "Node": "nodes", "ReplicationController": "replicationcontrollers", "Event": "events",
	"Namespace": "namespaces", "Secret": "secrets", "Service": "services", "PersistentVolume": "persistentvolumes",
	"PersistentVolumeClaim": "persistentvolumeclaims", "ConfigMap": "configmaps", "ReplicaSet": "replicasets",
	"Deployment": "deployments", "Job": "jobs", "CronJob": "cronjobs", "CertificateSigningRequest": "certificatesigningrequests",
	"ClusterTrustBundle": "clustertrustbundles", "PodCertificateRequest": "podcertificaterequests",
	"ResourceSlice": "resourceslices", "LeaseCandidate": "leasecandidates", "Lease": "leases",
}

var clusterScoped = map[string]bool{
	"nodes": true, "namespaces": true, "persistentvolumes": true, "certificatesigningrequests": true,
	"clustertrustbundles": true, "resourceslices": true,
}

func readLines(t *testing.T, name string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if len(lines) == 0 {
		t.Fatalf("%s is empty", name)
	}
	return lines
}

func TestConversionsMatchKube(t *testing.T) {
	for _, line := range readLines(t, "conversions.golden") {
		parts := strings.SplitN(line, "|", 4)
		gvkS, label, want := parts[0], parts[1], parts[2]+"|"+parts[3]
		i := strings.LastIndex(gvkS, "/")
		gv, err := schema.ParseGroupVersion(gvkS[:i])
		if err != nil {
			t.Fatal(err)
		}
		resource := resourceOfKind[gvkS[i+1:]]
		r := mustNew(t, Spec{GVR: gv.WithResource(resource), Namespaced: !clusterScoped[resource]})
		var got string
		if nl, nv, err := r.ConvertFieldLabel(label, "v"); err != nil {
			got = "ERR|" + err.Error()
		} else {
			got = "OK|" + nl + "=" + nv
		}
		if got != want {
			t.Errorf("%s %s: got %s, kube-apiserver %s", gvkS, label, got, want)
		}
	}
}

func TestFieldSetsMatchKube(t *testing.T) {
	for _, line := range readLines(t, "fieldsets.golden") {
		parts := strings.Split(line, "|")
		file, want := parts[0], strings.Join(parts[1:], "|")
		// <group>.<version>.<resource>.<case>.json, group "core" = "".
		segs := strings.Split(strings.TrimSuffix(file, ".json"), ".")
		n := len(segs)
		group := strings.Join(segs[:n-3], ".")
		if group == "core" {
			group = ""
		}
		gvr := schema.GroupVersionResource{Group: group, Version: segs[n-3], Resource: segs[n-2]}
		data, err := os.ReadFile(filepath.Join("testdata", "objects", file))
		if err != nil {
			t.Fatal(err)
		}
		set, err := mustNew(t, Spec{GVR: gvr, Namespaced: !clusterScoped[gvr.Resource]}).Set(decode(t, string(data)))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		keys := make([]string, 0, len(set))
		for k, v := range set {
			keys = append(keys, k+"="+v)
		}
		sort.Strings(keys)
		if got := strings.Join(keys, "|"); got != want {
			t.Errorf("%s:\n got %s\nkube %s", file, got, want)
		}
	}
}

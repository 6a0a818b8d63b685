// Command kubescheme regenerates the golden files of package fields from
// kube-apiserver's own code: the field label conversions registered in
// legacyscheme and the registries' GetAttrs field sets for the objects in
// ../objects. It needs k8s.io/kubernetes, which cachetier's go.mod must not
// require, so run it from a copy of the hack/k8s-build module:
//
//	cp -r hack/k8s-build /tmp/kubescheme && sed -i 's#^module .*#module kubescheme#' /tmp/kubescheme/go.mod
//	cp cache-server/internal/fields/testdata/kubescheme/main.go /tmp/kubescheme/
//	(cd /tmp/kubescheme && GOFLAGS=-mod=mod go run . $OLDPWD/cache-server/internal/fields/testdata)
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	_ "k8s.io/kubernetes/pkg/apis/batch/install"
	_ "k8s.io/kubernetes/pkg/apis/certificates/install"
	_ "k8s.io/kubernetes/pkg/apis/coordination/install"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	_ "k8s.io/kubernetes/pkg/apis/events/install"
	_ "k8s.io/kubernetes/pkg/apis/resource/install"
	"k8s.io/kubernetes/pkg/registry/apps/replicaset"
	"k8s.io/kubernetes/pkg/registry/batch/job"
	"k8s.io/kubernetes/pkg/registry/certificates/certificates"
	"k8s.io/kubernetes/pkg/registry/coordination/leasecandidate"
	"k8s.io/kubernetes/pkg/registry/core/configmap"
	"k8s.io/kubernetes/pkg/registry/core/event"
	"k8s.io/kubernetes/pkg/registry/core/namespace"
	"k8s.io/kubernetes/pkg/registry/core/node"
	"k8s.io/kubernetes/pkg/registry/core/persistentvolume"
	"k8s.io/kubernetes/pkg/registry/core/persistentvolumeclaim"
	"k8s.io/kubernetes/pkg/registry/core/pod"
	"k8s.io/kubernetes/pkg/registry/core/replicationcontroller"
	"k8s.io/kubernetes/pkg/registry/core/secret"
	"k8s.io/kubernetes/pkg/registry/core/service"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
)

type attrFunc func(runtime.Object) (labels.Set, fields.Set, error)

var attrs = map[string]attrFunc{
	"pods": pod.GetAttrs, "nodes": node.GetAttrs, "namespaces": namespace.GetAttrs, "secrets": secret.GetAttrs,
	"services": service.GetAttrs, "replicationcontrollers": replicationcontroller.GetAttrs, "events": event.GetAttrs,
	"persistentvolumes": persistentvolume.GetAttrs, "persistentvolumeclaims": persistentvolumeclaim.GetAttrs,
	"configmaps": configmap.GetAttrs, "replicasets": replicaset.GetAttrs, "jobs": job.GetAttrs,
	"certificatesigningrequests": certificates.GetAttrs, "resourceslices": resourceslice.GetAttrs,
	"leasecandidates": leasecandidate.GetAttrs,
}

func main() {
	dir := os.Args[1]
	if err := conversions(filepath.Join(dir, "conversions.golden")); err != nil {
		panic(err)
	}
	if err := fieldSets(dir); err != nil {
		panic(err)
	}
}

func conversions(out string) error {
	gvks := []schema.GroupVersionKind{
		{Version: "v1", Kind: "Pod"}, {Version: "v1", Kind: "Node"}, {Version: "v1", Kind: "ReplicationController"},
		{Version: "v1", Kind: "Event"}, {Group: "events.k8s.io", Version: "v1", Kind: "Event"}, {Version: "v1", Kind: "Namespace"},
		{Version: "v1", Kind: "Secret"}, {Version: "v1", Kind: "Service"}, {Version: "v1", Kind: "PersistentVolume"},
		{Version: "v1", Kind: "PersistentVolumeClaim"}, {Version: "v1", Kind: "ConfigMap"}, {Group: "apps", Version: "v1", Kind: "ReplicaSet"},
		{Group: "apps", Version: "v1", Kind: "Deployment"}, {Group: "batch", Version: "v1", Kind: "Job"}, {Group: "batch", Version: "v1", Kind: "CronJob"},
		{Group: "certificates.k8s.io", Version: "v1", Kind: "CertificateSigningRequest"}, {Group: "certificates.k8s.io", Version: "v1", Kind: "ClusterTrustBundle"},
		{Group: "certificates.k8s.io", Version: "v1", Kind: "PodCertificateRequest"}, {Group: "certificates.k8s.io", Version: "v1beta1", Kind: "ClusterTrustBundle"},
		{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceSlice"}, {Group: "resource.k8s.io", Version: "v1beta2", Kind: "ResourceSlice"},
		{Group: "coordination.k8s.io", Version: "v1", Kind: "LeaseCandidate"}, {Group: "coordination.k8s.io", Version: "v1beta1", Kind: "LeaseCandidate"},
		{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"},
	}
	labels := []string{"metadata.name", "metadata.namespace", "foo", "spec.host", "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName",
		"spec.unschedulable", "status.replicas", "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
		"regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid", "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath", "reportingController",
		"name", "spec.clusterIP", "spec.type", "status.successful", "spec.signerName", "spec.podName", "spec.driver", "spec.pool.name", "spec.leaseName"}
	var b strings.Builder
	for _, gvk := range gvks {
		for _, l := range labels {
			nl, nv, err := legacyscheme.Scheme.ConvertFieldLabel(gvk, l, "v")
			if err != nil {
				fmt.Fprintf(&b, "%s/%s|%s|ERR|%s\n", gvk.GroupVersion(), gvk.Kind, l, err)
			} else {
				fmt.Fprintf(&b, "%s/%s|%s|OK|%s=%s\n", gvk.GroupVersion(), gvk.Kind, l, nl, nv)
			}
		}
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}

func fieldSets(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "objects", "*.json"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	dec := legacyscheme.Codecs.UniversalDecoder()
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj, _, err := dec.Decode(data, nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		base := filepath.Base(f)
		parts := strings.Split(strings.TrimSuffix(base, ".json"), ".")
		resource := parts[len(parts)-2]
		_, set, err := attrs[resource](obj)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		keys := make([]string, 0, len(set))
		for k := range set {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&b, "%s", base)
		for _, k := range keys {
			fmt.Fprintf(&b, "|%s=%s", k, set[k])
		}
		b.WriteString("\n")
	}
	return os.WriteFile(filepath.Join(dir, "fieldsets.golden"), []byte(b.String()), 0o644)
}

package nodeinstall

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// LeaderElectionID is the Lease the manager replicas elect a leader with
// (cmd/manager), in OperatorNamespace.
const LeaderElectionID = "cachetier-operator.cachetier.io"

// Leader returns the manager pod that holds the leader Lease: client-go's
// resource lock names its holder <pod name>_<random>.
func (in *Installer) Leader(ctx context.Context) (*corev1.Pod, error) {
	lease, err := in.Client.CoordinationV1().Leases(OperatorNamespace).Get(ctx, LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil, fmt.Errorf("lease %s has no holder", LeaderElectionID)
	}
	name, _, _ := strings.Cut(*lease.Spec.HolderIdentity, "_")
	return in.Client.CoreV1().Pods(OperatorNamespace).Get(ctx, name, metav1.GetOptions{})
}

// childKinds are the kinds of a profile's children (controllers' Desired),
// each listed by the profile label.
var childKinds = []struct {
	gvr        schema.GroupVersionResource
	namespaced bool
}{
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "statefulsets"}, true},
	{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, true},
	{schema.GroupVersionResource{Version: "v1", Resource: "pods"}, true},
	{schema.GroupVersionResource{Version: "v1", Resource: "services"}, true},
	{schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, true},
	{schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, true},
	{schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true},
	{schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"}, true},
	{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}, true},
	{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}, true},
	{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, false},
	{schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, false},
	{schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}, false},
}

// DeleteSample deletes config/samples' profile as a user does (`kubectl
// delete -k config/samples --wait`) and waits until no child of it is
// left — cluster-scoped ones, the kube-system RoleBinding and the fleet's
// pods included. The error lists what was left.
func (in *Installer) DeleteSample(ctx context.Context, timeout time.Duration) error {
	if _, err := in.Cluster.RunKubectl(ctx, in.Cluster.AdminKubeconfig, "delete", "-k", filepath.Join(in.Root, "config", "samples"),
		"--wait=true", fmt.Sprintf("--timeout=%s", timeout)); err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(in.Admin)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		var left []string
		for _, k := range childKinds {
			var ri dynamic.ResourceInterface = dc.Resource(k.gvr)
			if k.namespaced {
				ri = dc.Resource(k.gvr).Namespace(metav1.NamespaceAll)
			}
			list, err := ri.List(ctx, metav1.ListOptions{LabelSelector: "cachetier.io/profile=" + SampleProfile})
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			if list == nil {
				continue
			}
			for _, it := range list.Items {
				left = append(left, fmt.Sprintf("%s %s/%s", k.gvr.Resource, it.GetNamespace(), it.GetName()))
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("children left %s after the profile was deleted:\n%s", timeout, strings.Join(left, "\n"))
		}
		time.Sleep(time.Second)
	}
}

package nodeinstall

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	apiregclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/controlplane"
)

// ProfilesGVR is the CacheProfile resource.
var ProfilesGVR = schema.GroupVersionResource{Group: "cachetier.io", Version: "v1alpha1", Resource: "cacheprofiles"}

// Dynamic is an admin client for kinds without Go types here
// (CacheProfiles).
func (in *Installer) Dynamic() dynamic.Interface {
	return dynamic.NewForConfigOrDie(in.Admin)
}

// Profile reads the sample profile.
func (in *Installer) Profile(ctx context.Context) (*cachev1alpha1.CacheProfile, error) {
	u, err := in.Dynamic().Resource(ProfilesGVR).Get(ctx, SampleProfile, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var p cachev1alpha1.CacheProfile
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Settled says whether the profile describes its current spec and that
// spec runs everywhere: Available, not Progressing, not Degraded. The
// string describes the conditions either way.
func Settled(p *cachev1alpha1.CacheProfile) (string, bool) {
	if p.Status.ObservedGeneration != p.Generation {
		return fmt.Sprintf("observedGeneration %d of %d", p.Status.ObservedGeneration, p.Generation), false
	}
	av := apimeta.FindStatusCondition(p.Status.Conditions, cachev1alpha1.ConditionAvailable)
	pr := apimeta.FindStatusCondition(p.Status.Conditions, cachev1alpha1.ConditionProgressing)
	dg := apimeta.FindStatusCondition(p.Status.Conditions, cachev1alpha1.ConditionDegraded)
	if av == nil || pr == nil || dg == nil {
		return "conditions not all set", false
	}
	desc := fmt.Sprintf("Available=%s (%s: %s) Progressing=%s (%s: %s) Degraded=%s (%s: %s) ready %s",
		av.Status, av.Reason, av.Message, pr.Status, pr.Reason, pr.Message, dg.Status, dg.Reason, dg.Message, p.Status.Ready)
	return desc, av.Status == metav1.ConditionTrue && pr.Status == metav1.ConditionFalse && dg.Status == metav1.ConditionFalse
}

// WaitProfile polls the sample profile until cond holds. It fails at once
// when a fleet pod cannot start without someone acting, or a node
// component exits, and on timeout; the error then says what a person would
// look at: the profile's status, the fleet's pods with their events, and
// the manager's last log lines.
func (in *Installer) WaitProfile(ctx context.Context, what string, timeout time.Duration, cond func(*cachev1alpha1.CacheProfile) (string, bool)) (*cachev1alpha1.CacheProfile, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	watch := podWatch{unschedulable: map[string]time.Time{}}
	for {
		if problem := watch.problem(ctx, in); problem != "" {
			return nil, fmt.Errorf("waiting for the profile to be %s: %s\n%s", what, problem, in.Diagnose())
		}
		p, err := in.Profile(ctx)
		if err == nil {
			var ok bool
			if last, ok = cond(p); ok {
				return p, nil
			}
		} else {
			last = err.Error()
		}
		if err := in.Cluster.Exited(); err != nil {
			return nil, fmt.Errorf("waiting for the profile to be %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("profile not %s after %s: %s\n%s", what, timeout, last, in.Diagnose())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// podWatch remembers since when each fleet pod has been unschedulable.
type podWatch struct{ unschedulable map[string]time.Time }

// problem names a pod in the operator's namespace that will not become
// Ready without someone acting (its image cannot be found, it crash-loops,
// it has stayed unschedulable for 30 s), so a wait fails at once with the
// reason rather than at its timeout.
func (w podWatch) problem(ctx context.Context, in *Installer) string {
	pods, err := in.Client.CoreV1().Pods(OperatorNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if reason := cluster.PodCannotStart(p); reason != "" {
			return fmt.Sprintf("pod %s cannot start: %s", p.Name, reason)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				if first, ok := w.unschedulable[p.Name]; !ok {
					w.unschedulable[p.Name] = time.Now()
				} else if time.Since(first) > 30*time.Second {
					return fmt.Sprintf("pod %s unschedulable for 30 s: %s", p.Name, c.Message)
				}
			}
		}
	}
	return ""
}

// Diagnose describes the profile's status, the operator namespace's pods
// (state, events) and the manager's and kube-controller-manager's last
// log lines.
func (in *Installer) Diagnose() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var b strings.Builder
	if p, err := in.Profile(ctx); err == nil {
		st, _ := json.MarshalIndent(p.Status, "", "  ")
		fmt.Fprintf(&b, "profile status:\n%s\n", st)
	}
	// Compact lines first: a CI log keeps the start and the end of a long
	// message, and the verbose pod descriptions below are the middle.
	b.WriteString(in.workloads(ctx))
	b.WriteString(in.Cluster.DescribePods(ctx, in.Client, OperatorNamespace, ""))
	b.WriteString(in.PodLogs(ctx, ManagerSelector, 40))
	fmt.Fprintf(&b, "kube-controller-manager log:\n%s\n", controlplane.LogTail(in.Cluster.LogPath("kube-controller-manager"), 20))
	return b.String()
}

// PodLogs is the last tail lines of the log of each pod in the operator's
// namespace that selector matches.
func (in *Installer) PodLogs(ctx context.Context, selector string, tail int64) string {
	pods, err := in.Client.CoreV1().Pods(OperatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("pods %q: %v\n", selector, err)
	}
	var b strings.Builder
	for _, p := range pods.Items {
		logs, err := in.Client.CoreV1().Pods(OperatorNamespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
		if err != nil {
			logs = []byte(err.Error())
		}
		fmt.Fprintf(&b, "pod %s log:\n%s\n", p.Name, logs)
	}
	return b.String()
}

// workloads is one line per Deployment, ReplicaSet with pods, StatefulSet
// and pod in the operator's namespace: what a rollout waits for.
func (in *Installer) workloads(ctx context.Context) string {
	var b strings.Builder
	apps := in.Client.AppsV1()
	if ds, err := apps.Deployments(OperatorNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, d := range ds.Items {
			st := d.Status
			fmt.Fprintf(&b, "deployment %s: generation %d observed %d, replicas %d updated %d ready %d available %d terminating %d;%s\n",
				d.Name, d.Generation, st.ObservedGeneration, st.Replicas, st.UpdatedReplicas, st.ReadyReplicas, st.AvailableReplicas,
				ptr.Deref(st.TerminatingReplicas, 0), deploymentConditions(st.Conditions))
		}
	}
	if rss, err := apps.ReplicaSets(OperatorNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, r := range rss.Items {
			if r.Status.Replicas > 0 || ptr.Deref(r.Spec.Replicas, 0) > 0 {
				fmt.Fprintf(&b, "replicaset %s: want %d, replicas %d ready %d available %d\n",
					r.Name, ptr.Deref(r.Spec.Replicas, 0), r.Status.Replicas, r.Status.ReadyReplicas, r.Status.AvailableReplicas)
			}
		}
	}
	if sts, err := apps.StatefulSets(OperatorNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, s := range sts.Items {
			st := s.Status
			fmt.Fprintf(&b, "statefulset %s: generation %d observed %d, replicas %d updated %d ready %d, revision %s -> %s\n",
				s.Name, s.Generation, st.ObservedGeneration, st.Replicas, st.UpdatedReplicas, st.ReadyReplicas, st.CurrentRevision, st.UpdateRevision)
		}
	}
	if pods, err := in.Client.CoreV1().Pods(OperatorNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			ready := "not ready"
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = "ready"
				}
			}
			deleting := ""
			if p.DeletionTimestamp != nil {
				deleting = ", deleting since " + p.DeletionTimestamp.UTC().Format(time.TimeOnly)
			}
			fmt.Fprintf(&b, "pod %s on %q: %s, %s%s\n", p.Name, p.Spec.NodeName, p.Status.Phase, ready, deleting)
		}
	}
	return b.String()
}

func deploymentConditions(cs []appsv1.DeploymentCondition) string {
	var out string
	for _, c := range cs {
		out += fmt.Sprintf(" %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	return out
}

// APIServiceAvailable reports the aggregator's own verdict on an
// APIService, which it reaches through the front Service's EndpointSlices.
func (in *Installer) APIServiceAvailable(ctx context.Context, name string) (string, bool) {
	ac, err := apiregclient.NewForConfig(in.Admin)
	if err != nil {
		return err.Error(), false
	}
	a, err := ac.ApiregistrationV1().APIServices().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error(), false
	}
	for _, c := range a.Status.Conditions {
		if c.Type == "Available" {
			return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message), c.Status == "True"
		}
	}
	return "no Available condition", false
}

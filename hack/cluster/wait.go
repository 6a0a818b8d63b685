package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/hack/controlplane"
)

// waitFor polls cond every 250 ms until it holds, a component process exits
// (exited returns its error with its log lines) or timeout passes. On
// timeout the error carries cond's last detail and, when diag is set, what
// diag says about the state of things — never just "timed out".
func waitFor(ctx context.Context, what string, timeout time.Duration, exited func() error,
	cond func(ctx context.Context) (detail string, ok bool), diag func(ctx context.Context) string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var detail string
	for {
		if exited != nil {
			if err := exited(); err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
		}
		var ok bool
		if detail, ok = cond(ctx); ok {
			return nil
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s not reached after %s: %s", what, timeout, detail)
			if diag != nil {
				dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
				msg += "\n" + diag(dctx)
				dcancel()
			}
			return fmt.Errorf("%s", msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// WaitPodsReady waits until at least want pods in namespace matching
// selector are Ready (want 0: every matching pod, and at least one). It
// fails fast when a pod cannot start — image missing, crash loop, sandbox
// or volume errors — and on failure or timeout says, per pod, its phase,
// conditions, container states, the pod's events and the kubelet's recent
// log lines about it.
func (c *Cluster) WaitPodsReady(ctx context.Context, namespace, selector string, want int, timeout time.Duration) error {
	cs, _, err := c.Clientset()
	if err != nil {
		return err
	}
	what := fmt.Sprintf("pods %q in %s Ready", selector, namespace)
	if want > 0 {
		what = fmt.Sprintf("%d %s", want, what)
	}
	var fatal error
	err = waitFor(ctx, what, timeout, c.Exited,
		func(ctx context.Context) (string, bool) {
			pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return err.Error(), false
			}
			ready := 0
			var states []string
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp != nil {
					continue
				}
				if PodReady(p) {
					ready++
					continue
				}
				if reason := PodCannotStart(p); reason != "" {
					fatal = fmt.Errorf("pod %s/%s cannot start: %s", p.Namespace, p.Name, reason)
					return reason, true
				}
				states = append(states, p.Name+": "+podState(p))
			}
			if want > 0 {
				return fmt.Sprintf("%d/%d ready; %s", ready, want, strings.Join(states, "; ")), ready >= want
			}
			return fmt.Sprintf("%d ready; %s", ready, strings.Join(states, "; ")), ready > 0 && len(states) == 0
		},
		func(ctx context.Context) string { return c.DescribePods(ctx, cs, namespace, selector) })
	if fatal != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return fmt.Errorf("%w\n%s", fatal, c.DescribePods(dctx, cs, namespace, selector))
	}
	return err
}

// PodReady says whether the pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodCannotStart says why a pod will not become Ready without someone
// acting, or "" while it may still get there. Image pulls cannot succeed on
// this node (nothing can be pulled), so pull errors are final.
func PodCannotStart(p *corev1.Pod) string {
	for _, st := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if w := st.State.Waiting; w != nil {
			switch w.Reason {
			case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName",
				"CreateContainerConfigError", "CreateContainerError", "RunContainerError":
				return fmt.Sprintf("container %s: %s: %s", st.Name, w.Reason, w.Message)
			case "CrashLoopBackOff":
				if st.RestartCount >= 2 {
					return fmt.Sprintf("container %s: CrashLoopBackOff after %d restarts: %s", st.Name, st.RestartCount, w.Message)
				}
			}
		}
	}
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Sprintf("phase Failed: %s %s", p.Status.Reason, p.Status.Message)
	}
	return ""
}

func podState(p *corev1.Pod) string {
	parts := []string{string(p.Status.Phase)}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			parts = append(parts, fmt.Sprintf("%s=%s(%s %s)", cond.Type, cond.Status, cond.Reason, cond.Message))
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		switch {
		case st.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting %s %s", st.Name, st.State.Waiting.Reason, st.State.Waiting.Message))
		case st.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated %s exit %d", st.Name, st.State.Terminated.Reason, st.State.Terminated.ExitCode))
		case st.State.Running != nil && !st.Ready:
			parts = append(parts, st.Name+" running, not ready")
		}
	}
	return strings.Join(parts, ", ")
}

// DescribePods is what a person would look at when pods do not come up: per
// pod its state, its events, its containers' last log lines and the
// kubelet's log lines that mention it.
func (c *Cluster) DescribePods(ctx context.Context, cs kubernetes.Interface, namespace, selector string) string {
	var b strings.Builder
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return "list pods: " + err.Error()
	}
	if len(pods.Items) == 0 {
		fmt.Fprintf(&b, "no pods match %q in %s; events in the namespace:\n", selector, namespace)
		b.WriteString(c.events(ctx, cs, namespace, ""))
		return b.String()
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		fmt.Fprintf(&b, "pod %s/%s on %q: %s\n", p.Namespace, p.Name, p.Spec.NodeName, podState(p))
		b.WriteString(c.events(ctx, cs, namespace, p.Name))
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount > 0 || st.State.Terminated != nil {
				tail := int64(15)
				logs, err := cs.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: st.Name, TailLines: &tail, Previous: st.RestartCount > 0 && st.State.Terminated == nil}).DoRaw(ctx)
				if err != nil {
					fmt.Fprintf(&b, "  logs of %s: %v\n", st.Name, err)
				} else {
					fmt.Fprintf(&b, "  logs of %s:\n%s\n", st.Name, indent(string(logs)))
				}
			}
		}
		if n := c.Node(p.Spec.NodeName); n != nil {
			if lines := grepLog(n.LogPath(procKubelet), p.Name, 10); lines != "" {
				fmt.Fprintf(&b, "  %s's kubelet log lines about %s:\n%s\n", n.Name, p.Name, indent(lines))
			}
		}
	}
	return b.String()
}

func (c *Cluster) events(ctx context.Context, cs kubernetes.Interface, namespace, name string) string {
	opts := metav1.ListOptions{}
	if name != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("involvedObject.name", name).String()
	}
	evs, err := cs.CoreV1().Events(namespace).List(ctx, opts)
	if err != nil {
		return "  events: " + err.Error() + "\n"
	}
	sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "  event %s %s %s/%s: %s (x%d)\n", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message, e.Count)
	}
	return b.String()
}

func grepLog(path, needle string, n int) string {
	var hits []string
	for _, line := range strings.Split(controlplane.LogTail(path, 5000), "\n") {
		if strings.Contains(line, needle) {
			hits = append(hits, line)
		}
	}
	if len(hits) > n {
		hits = hits[len(hits)-n:]
	}
	return strings.Join(hits, "\n")
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "    (empty)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}

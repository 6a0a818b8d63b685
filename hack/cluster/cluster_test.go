package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/hack/imagebuild"
	"github.com/cachetier/cachetier/hack/proctree"
)

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testImages(t *testing.T) (Options, map[string]string) {
	t.Helper()
	images, err := imagebuild.Prebuilt(context.Background(), filepath.Join(t.TempDir(), "images"), testLog{t},
		imagebuild.Pause, imagebuild.CoreDNS, imagebuild.NetCheck)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Log: testLog{t}, ReadyTimeout: 2 * time.Minute}
	refs := map[string]string{}
	for _, img := range images {
		opts.Images = append(opts.Images, Image{Ref: img.Ref, Archive: img.Tar})
		refs[img.Name] = img.Ref
	}
	opts.PauseImage, opts.CoreDNSImage = refs[imagebuild.Pause], refs[imagebuild.CoreDNS]
	return opts, refs
}

// TestNodeCluster starts two nodes and checks, from inside pods, what every
// in-cluster client depends on — cluster DNS, the apiserver through the
// `kubernetes` Service, a mounted ServiceAccount token, the other node's
// pods directly and through a Service — and, from the host, pod IPs on
// both nodes, a ClusterIP routed to a pod, kubectl logs and exec through
// either kubelet, and fail-fast diagnostics for pods that cannot start. A
// node stopped as a machine dies goes silent and comes back under its name
// and addresses. Then the teardown must leave nothing behind.
func TestNodeCluster(t *testing.T) {
	opts, refs := testImages(t)
	opts.Nodes = 2
	ctx := context.Background()
	start := time.Now()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster of %d nodes up in %s", len(c.Nodes), time.Since(start).Round(time.Millisecond))
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	cs, _, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}

	for _, n := range c.Nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := internalIP(node); got != n.Addresses.IP.String() {
			t.Fatalf("node %s InternalIP %q, want %s", n.Name, got, n.Addresses.IP)
		}
	}

	// The probe: a Deployment (scheduler, ReplicaSet controller, kubelets)
	// with a pod on each node, whose readiness needs DNS, the apiserver
	// Service and its token.
	ns := "default"
	deploy := netcheckDeployment(refs[imagebuild.NetCheck], len(c.Nodes))
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "netcheck"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "netcheck"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if svc, err = cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := c.netcheckPods(t, ns)
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.RunKubectl(ctx, c.AdminKubeconfig, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for j, n := range c.Nodes {
		pod, other := pods[n.Name], pods[c.Nodes[(j+1)%len(c.Nodes)].Name]
		if !n.Addresses.PodCIDR.Contains(netIP(pod.Status.PodIP)) {
			t.Fatalf("pod %s on %s has IP %s outside the node's pod range %s", pod.Name, n.Name, pod.Status.PodIP, n.Addresses.PodCIDR)
		}
		// kubectl logs: the apiserver reaches each kubelet by its InternalIP.
		logs := kubectl("logs", "-n", ns, pod.Name)
		if !strings.Contains(logs, "resolves to ["+c.Addresses.APIServerServiceIP.String()+"]") || !strings.Contains(logs, `"username":"system:serviceaccount:default:default"`) {
			t.Fatalf("the probe on %s did not resolve the apiserver Service and authenticate with its token:\n%s", n.Name, logs)
		}
		// kubectl exec: DNS of a Service from each node.
		if out := kubectl("exec", "-n", ns, pod.Name, "--", "/netcheck", "resolve", "netcheck.default.svc.cluster.local"); strings.TrimSpace(out) != svc.Spec.ClusterIP {
			t.Fatalf("netcheck.default.svc resolves to %q on %s, want %s", out, n.Name, svc.Spec.ClusterIP)
		}
		// A pod reaches the other node's pod directly.
		if out := kubectl("exec", "-n", ns, pod.Name, "--", "/netcheck", "get", "http://"+other.Status.PodIP+":8080/"); !strings.Contains(out, "hello from "+other.Name) {
			t.Fatalf("pod on %s to the pod on the other node: %q", n.Name, out)
		}
		// The host reaches the pod.
		if body := httpGet(t, "http://"+pod.Status.PodIP+":8080/"); !strings.Contains(body, "hello from "+pod.Name) {
			t.Fatalf("GET pod %s on %s from the host: %q", pod.Name, n.Name, body)
		}
	}
	// Through the Service, from one node, both pods answer (kube-proxy
	// picks an endpoint per connection): pod -> ClusterIP -> a pod on
	// this node (the hairpin case) or the other. The pods are Ready before
	// kube-proxy has their endpoints (the EndpointSlice controller and
	// kube-proxy's next sync follow readiness; until then the Service
	// rejects), so this waits until both were seen.
	from := pods[NodeName]
	seen := map[string]bool{}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := c.RunKubectl(ctx, c.AdminKubeconfig, "exec", "-n", ns, from.Name, "--", "/netcheck", "get", "http://netcheck.default.svc/")
		for _, p := range pods {
			if err == nil && strings.Contains(string(out), "hello from "+p.Name) {
				seen[p.Name] = true
			}
		}
		return len(seen) == len(pods), nil
	})
	if err != nil {
		t.Fatalf("through the Service, from %s, answered only %v", NodeName, seen)
	}
	if body := httpGet(t, "http://"+svc.Spec.ClusterIP+"/"); !strings.Contains(body, "hello from ") {
		t.Fatalf("GET the Service from the host: %q", body)
	}
	// Names outside the cluster are never asked upstream.
	if _, err := c.Resolver().LookupHost(ctx, "example.com"); err == nil {
		t.Fatal("the cluster DNS answered example.com; it must not forward outside the cluster")
	}

	t.Run("a node stops as a machine dies and comes back", func(t *testing.T) {
		n := c.Nodes[1]
		pod := pods[n.Name]
		if err := c.StopNode(ctx, n.Name); err != nil {
			t.Fatal(err)
		}
		for pid, p := range proctree.Read() {
			if strings.Contains(p.Cmdline, n.Layout.Dir+"/") {
				t.Errorf("process %d of the stopped node still runs: %s", pid, p.Cmdline)
			}
		}
		// Silent: nothing answers, not even with a refusal.
		for _, addr := range []string{net.JoinHostPort(n.Addresses.IP.String(), "10250"), net.JoinHostPort(pod.Status.PodIP, "8080")} {
			conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
			if err == nil {
				conn.Close()
				t.Fatalf("%s answered while its node was down", addr)
			}
			if strings.Contains(err.Error(), "refused") {
				t.Fatalf("%s refused a connection while its node was down: %v", addr, err)
			}
		}
		if err := c.StartNode(ctx, n.Name); err != nil {
			t.Fatal(err)
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := internalIP(node); got != n.Addresses.IP.String() {
			t.Fatalf("node %s came back with InternalIP %q, want %s", n.Name, got, n.Addresses.IP)
		}
		// Its pod runs again (the kubelet restarts the pods still bound
		// to it: a new container) and is reached from the other node.
		// Polled without failing on the way: right after the restart the
		// pod may still show the Ready status its old container left, then
		// not ready while the new one starts.
		var back corev1.Pod
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			byNode, err := readyNetcheckPods(ctx, cs, ns)
			if err != nil {
				return false, nil
			}
			var ok bool
			if back, ok = byNode[n.Name]; !ok {
				return false, nil
			}
			return back.Status.ContainerStatuses[0].ContainerID != pod.Status.ContainerStatuses[0].ContainerID, nil
		})
		if err != nil {
			t.Fatalf("the pod on %s was not started again: %+v", n.Name, back.Status)
		}
		if out := kubectl("exec", "-n", ns, pods[NodeName].Name, "--", "/netcheck", "get", "http://"+back.Status.PodIP+":8080/"); !strings.Contains(out, "hello from "+back.Name) {
			t.Fatalf("the restarted node's pod from the other node: %q", out)
		}
	})

	t.Run("image not on the node fails fast", func(t *testing.T) {
		p := probePod("no-image", "localhost/cachetier/does-not-exist:1")
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := c.WaitPodsReady(ctx, ns, "app=no-image", 1, 2*time.Minute)
		if err == nil || !strings.Contains(err.Error(), "cannot start") || !strings.Contains(err.Error(), "does-not-exist") {
			t.Fatalf("want a fast failure naming the image, got %v", err)
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("took %s to see the image is missing", time.Since(start))
		}
	})
	t.Run("stuck in ContainerCreating says why", func(t *testing.T) {
		p := probePod("no-secret", refs[imagebuild.NetCheck])
		p.Spec.Volumes = []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "missing-secret"}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "s", MountPath: "/s"}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := c.WaitPodsReady(ctx, ns, "app=no-secret", 1, 20*time.Second)
		if err == nil || !strings.Contains(err.Error(), "ContainerCreating") || !strings.Contains(err.Error(), `secret "missing-secret" not found`) {
			t.Fatalf("want the pod's state and its FailedMount event, got %v", err)
		}
	})

	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if left := c.Leftovers(ctx); len(left) > 0 {
		t.Fatalf("teardown left:\n%s", strings.Join(left, "\n"))
	}
}

// netcheckPods waits until every netcheck pod is Ready and returns them by
// node, one per node.
func (c *Cluster) netcheckPods(t *testing.T, ns string) map[string]corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if err := c.WaitPodsReady(ctx, ns, "app=netcheck", len(c.Nodes), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	cs, _, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	byNode, err := readyNetcheckPods(ctx, cs, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(byNode) != len(c.Nodes) {
		t.Fatalf("netcheck pods by node: %v, want one on each of %v", keys(byNode), c.NodeNames())
	}
	return byNode
}

// readyNetcheckPods lists ns's ready netcheck pods by node.
func readyNetcheckPods(ctx context.Context, cs kubernetes.Interface, ns string) (map[string]corev1.Pod, error) {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=netcheck"})
	if err != nil {
		return nil, err
	}
	byNode := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && PodReady(&p) {
			byNode[p.Spec.NodeName] = p
		}
	}
	return byNode, nil
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// TestNodeThatNeverTurnsReadyFailsFast: a kubelet that cannot reach its
// container runtime makes Start fail within seconds with the kubelet's own
// log lines, and the half-started cluster is removed.
func TestNodeThatNeverTurnsReadyFailsFast(t *testing.T) {
	opts, _ := testImages(t)
	opts.ExtraKubeletArgs = []string{"--container-runtime-endpoint=unix:///nonexistent/containerd.sock"}
	opts.ReadyTimeout = 90 * time.Second
	start := time.Now()
	c, err := Start(context.Background(), opts)
	if err == nil {
		c.Stop()
		t.Fatal("a node without a container runtime started")
	}
	took := time.Since(start)
	if !strings.Contains(err.Error(), "kubelet") || !strings.Contains(err.Error(), "nonexistent/containerd.sock") {
		t.Fatalf("the error does not carry the kubelet's complaint: %v", err)
	}
	if took > 80*time.Second {
		t.Fatalf("took %s to fail; the wait is %s", took, opts.ReadyTimeout)
	}
	t.Logf("failed after %s with: %.300s", took.Round(time.Millisecond), err)
	if left := leftoversOfAnyRun(t); left != "" {
		t.Fatalf("a failed start left: %s", left)
	}
}

// leftoversOfAnyRun lists cluster namespaces that no running cluster owns;
// a failed Start must leave none of its own.
func leftoversOfAnyRun(t *testing.T) string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var left []string
	for _, line := range strings.Split(string(out), "\n") {
		name := strings.Fields(line + " x")[0]
		if slot, ok := netnsSlot(name); ok && !slotHeld(strconv.Itoa(slot)) {
			left = append(left, "network namespace "+name)
		}
	}
	return strings.Join(left, ", ")
}

// netcheckDeployment runs replicas probe pods, never two on one node.
func netcheckDeployment(image string, replicas int) *appsv1.Deployment {
	labels := map[string]string{"app": "netcheck"}
	spec := probePod("netcheck", image).Spec
	spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
		}},
	}}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "netcheck"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// The restarted node's pod is the same pod, started again:
			// no second one may appear elsewhere meanwhile.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
}

func probePod(app, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: app, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "netcheck", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args:           []string{"serve"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

func netIP(s string) net.IP { return net.ParseIP(s) }

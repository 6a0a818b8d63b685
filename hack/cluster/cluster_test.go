package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/hack/imagebuild"
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

// TestNodeCluster starts a node and checks, from inside a pod, what every
// in-cluster client depends on — cluster DNS, the apiserver through the
// `kubernetes` Service, a mounted ServiceAccount token — and, from the
// host, pod IPs, a ClusterIP routed to a pod, kubectl logs and exec through
// the kubelet, and fail-fast diagnostics for pods that cannot start. Then
// the teardown must leave nothing behind.
func TestNodeCluster(t *testing.T) {
	opts, refs := testImages(t)
	ctx := context.Background()
	start := time.Now()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s", time.Since(start).Round(time.Millisecond))
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

	node, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var internal string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if internal != c.Addresses.NodeIP.String() {
		t.Fatalf("node InternalIP %q, want %s", internal, c.Addresses.NodeIP)
	}

	// The probe: a Deployment (scheduler, ReplicaSet controller, kubelet)
	// whose readiness needs DNS, the apiserver Service and its token.
	ns := "default"
	deploy := netcheckDeployment(refs[imagebuild.NetCheck])
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
	if err := c.WaitPodsReady(ctx, ns, "app=netcheck", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=netcheck"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("netcheck pods: %v", err)
	}
	pod := pods.Items[0]
	if !c.Addresses.PodCIDR.Contains(netIP(pod.Status.PodIP)) {
		t.Fatalf("pod IP %s outside the pod range %s", pod.Status.PodIP, c.Addresses.PodCIDR)
	}

	kubectl := func(args ...string) string {
		t.Helper()
		out, err := c.RunKubectl(ctx, c.AdminKubeconfig, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	// kubectl logs: the apiserver reaches the kubelet by the node's InternalIP.
	logs := kubectl("logs", "-n", ns, pod.Name)
	if !strings.Contains(logs, "resolves to ["+c.Addresses.APIServerServiceIP.String()+"]") || !strings.Contains(logs, `"username":"system:serviceaccount:default:default"`) {
		t.Fatalf("the probe did not resolve the apiserver Service and authenticate with its token:\n%s", logs)
	}
	// kubectl exec: DNS of a Service, then pod -> ClusterIP -> pod (itself:
	// the hairpin case) by name.
	if out := kubectl("exec", "-n", ns, pod.Name, "--", "/netcheck", "resolve", "netcheck.default.svc.cluster.local"); strings.TrimSpace(out) != svc.Spec.ClusterIP {
		t.Fatalf("netcheck.default.svc resolves to %q in the pod, want %s", out, svc.Spec.ClusterIP)
	}
	// The pod is Ready before kube-proxy has its endpoint: the
	// EndpointSlice controller and kube-proxy's next sync follow
	// readiness, and until then the Service rejects ("no route to host",
	// seen in CI on a loaded machine). Retry for as long as that takes.
	var out []byte
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err = c.RunKubectl(ctx, c.AdminKubeconfig, "exec", "-n", ns, pod.Name, "--", "/netcheck", "get", "http://netcheck.default.svc/")
		return err == nil, nil
	})
	if err != nil || !strings.Contains(string(out), "hello from "+pod.Name) {
		t.Fatalf("pod to its own Service: %v: %q", err, out)
	}
	// The host reaches the pod and the Service.
	for _, url := range []string{"http://" + pod.Status.PodIP + ":8080/", "http://" + svc.Spec.ClusterIP + "/"} {
		if body := httpGet(t, url); !strings.Contains(body, "hello from "+pod.Name) {
			t.Fatalf("GET %s from the host: %q", url, body)
		}
	}
	// Names outside the cluster are never asked upstream.
	if _, err := c.Resolver().LookupHost(ctx, "example.com"); err == nil {
		t.Fatal("the cluster DNS answered example.com; it must not forward outside the cluster")
	}

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

// leftoversOfAnyRun lists cluster namespaces and node directories that no
// running cluster owns; a failed Start must leave none of its own.
func leftoversOfAnyRun(t *testing.T) string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var left []string
	for _, line := range strings.Split(string(out), "\n") {
		if name := strings.Fields(line + " x")[0]; strings.HasPrefix(name, "cachetier-node-") {
			slot := strings.TrimPrefix(name, "cachetier-node-")
			if !slotHeld(slot) {
				left = append(left, "network namespace "+name)
			}
		}
	}
	return strings.Join(left, ", ")
}

func netcheckDeployment(image string) *appsv1.Deployment {
	labels := map[string]string{"app": "netcheck"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "netcheck"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: probePod("netcheck", image).Spec},
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

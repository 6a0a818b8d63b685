// Package nodes runs cachetier on a real cluster of three nodes
// (hack/cluster: each node a kubelet, containerd and kube-proxy in a
// network namespace of its own): installed as users install it, then
// drained node by node, a node lost as a machine dies, and the node of the
// leading manager lost — with informers, a writer and a reader loop going
// through the profile's status.serverURL all along. At the end the
// informers hold what the apiserver holds.
package nodes

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

const (
	nodeCount         = 3
	operatorNamespace = nodeinstall.OperatorNamespace
	profileName       = nodeinstall.SampleProfile
	fleetSelector     = controllers.LabelProfile + "=" + profileName
)

var cachedNamespaces = nodeinstall.CachedNamespaces

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// env is the installed cluster the steps share.
type env struct {
	in    *nodeinstall.Installer
	c     *cluster.Cluster
	kc    kubernetes.Interface
	root  string
	dir   string
	pause string
	// tier reads through the profile's status.serverURL, as the admin.
	tier *rest.Config
}

// startCluster starts the nodes; they are torn down when the test ends,
// and the teardown must leave nothing behind.
func startCluster(t *testing.T) *env {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, dir: t.TempDir()}
	in, opts, err := nodeinstall.StartNodes(context.Background(), root, e.dir, nodeCount, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Teardown(); err != nil {
			t.Error(err)
		}
	})
	e.in, e.c, e.kc, e.pause = in, in.Cluster, in.Client, opts.PauseImage
	return e
}

// tierConfig is the admin's client configuration with the profile's
// status.serverURL as its server, as a user writes it into a kubeconfig.
func (e *env) tierConfig(t *testing.T, serverURL string) *rest.Config {
	t.Helper()
	path := e.dir + "/kubeconfig-tier"
	if err := controlplane.RewriteKubeconfig(e.c.AdminKubeconfig, path, serverURL, nil, ""); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg
}

func (e *env) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := e.c.RunKubectl(ctx, e.c.AdminKubeconfig, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func (e *env) waitProfile(t *testing.T, what string, timeout time.Duration, cond func(*cachev1alpha1.CacheProfile) (string, bool)) *cachev1alpha1.CacheProfile {
	t.Helper()
	p, err := e.in.WaitProfile(context.Background(), what, timeout, cond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// settledEverywhere: settled (nodeinstall.Settled), and every shard and
// the front at its full replica count.
func settledEverywhere(p *cachev1alpha1.CacheProfile) (string, bool) {
	d, ok := nodeinstall.Settled(p)
	for _, s := range p.Status.Shards {
		if s.ReadyReplicas != s.Replicas {
			ok = false
		}
	}
	return d, ok && len(p.Status.Shards) == int(p.Spec.Shards) && p.Status.FrontReadyReplicas == p.Spec.FrontReplicas
}

// fleetPods are the profile's pods that are not terminating.
func (e *env) fleetPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := e.kc.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: fleetSelector})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// replicaSet names the set a pod belongs to for placement: its shard, the
// fronts, or the managers.
func replicaSet(p *corev1.Pod) string {
	if s, ok := p.Labels[controllers.LabelShard]; ok {
		return profileName + "-shard-" + s
	}
	return p.Labels[controllers.LabelComponent]
}

// placement checks that no two pods of one replica set — a shard's
// replicas, the fronts, the managers — share a node, and describes where
// each runs.
func (e *env) placement(ctx context.Context) (string, error) {
	pods, err := e.fleetPods(ctx)
	if err != nil {
		return "", err
	}
	managers, err := e.kc.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: nodeinstall.ManagerSelector})
	if err != nil {
		return "", err
	}
	for _, m := range managers.Items {
		if m.DeletionTimestamp == nil {
			pods = append(pods, m)
		}
	}
	bySet := map[string]map[string][]string{} // set → node → pods
	for _, p := range pods {
		set := replicaSet(&p)
		if bySet[set] == nil {
			bySet[set] = map[string][]string{}
		}
		bySet[set][p.Spec.NodeName] = append(bySet[set][p.Spec.NodeName], p.Name)
	}
	var sets []string
	for s := range bySet {
		sets = append(sets, s)
	}
	sort.Strings(sets)
	var b strings.Builder
	var bad []string
	for _, s := range sets {
		fmt.Fprintf(&b, "  %-16s", s)
		var nodes []string
		for n := range bySet[s] {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		for _, n := range nodes {
			fmt.Fprintf(&b, " %s: %s;", n, strings.Join(bySet[s][n], ","))
			if len(bySet[s][n]) > 1 || n == "" {
				bad = append(bad, fmt.Sprintf("%s has %v on node %q", s, bySet[s][n], n))
			}
		}
		b.WriteString("\n")
	}
	if len(bad) > 0 {
		return b.String(), fmt.Errorf("replicas share a node: %s\n%s", strings.Join(bad, "; "), b.String())
	}
	return b.String(), nil
}

// shardSampler lists the fleet's pods every 250 ms and records every
// moment a shard had no ready replica (terminating pods not counted).
type shardSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	samples int
	gaps    []string
}

func (e *env) sampleShards(shards int) *shardSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &shardSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			pods, err := e.fleetPods(ctx)
			if err == nil {
				ready := map[string]int{}
				for i := range pods {
					if cluster.PodReady(&pods[i]) && pods[i].Labels[controllers.LabelComponent] == controllers.ComponentShard {
						ready[replicaSet(&pods[i])]++
					}
				}
				s.mu.Lock()
				s.samples++
				for i := 0; i < shards; i++ {
					if name := fmt.Sprintf("%s-shard-%d", profileName, i); ready[name] == 0 {
						s.gaps = append(s.gaps, fmt.Sprintf("%s: %s without a ready replica", time.Now().Format("15:04:05.000"), name))
					}
				}
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return s
}

// stop ends the sampling and returns how many samples it took and the gaps.
func (s *shardSampler) stop() (int, []string) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, s.gaps
}

// podState is what a healthy pod must keep across a node's return: its
// identity and its containers' restarts.
type podState struct {
	uid      string
	restarts int32
}

func (e *env) podStates(ctx context.Context) (map[string]podState, error) {
	pods, err := e.fleetPods(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]podState{}
	for _, p := range pods {
		var restarts int32
		for _, c := range p.Status.ContainerStatuses {
			restarts += c.RestartCount
		}
		out[p.Name] = podState{uid: string(p.UID), restarts: restarts}
	}
	return out, nil
}

// nodeMemory describes the resident memory of every running node's
// processes, by part.
func (e *env) nodeMemory() string {
	var b strings.Builder
	for _, n := range e.c.Nodes {
		if n.Down() {
			continue
		}
		m := n.Memory()
		var total uint64
		for _, v := range m {
			total += v
		}
		mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
		fmt.Fprintf(&b, "  %s: %.0f MiB (kubelet %.0f, containerd %.0f, kube-proxy %.0f, pods %.0f)\n",
			n.Name, mib(total), mib(m["kubelet"]), mib(m["containerd"]), mib(m["kube-proxy"]), mib(m["pods"]))
	}
	return b.String()
}

package install

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/utils/ptr"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/e2e/internal/clients"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// TestUserStory is cachetier's README story on a real node, step by step;
// each step needs the ones before it.
func TestUserStory(t *testing.T) {
	e := startCluster(t)
	var tierKubeconfig string
	var long *liveWatch
	t.Cleanup(func() {
		if long != nil {
			long.Stop()
		}
	})
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"install", func(t *testing.T) { tierKubeconfig = e.install(t, e.pause) }},
		{"start kubectl get -w", func(t *testing.T) { long = e.startLiveWatch(t, tierKubeconfig) }},
		{"kubectl", func(t *testing.T) { e.readWithKubectl(t, tierKubeconfig) }},
		{"rbac", func(t *testing.T) { e.readAsLimitedUser(t) }},
		{"informers", func(t *testing.T) { e.informersBothWays(t, tierKubeconfig) }},
		// Before the faults: they replace every front pod, which ends
		// every watch through the tier, as an apiserver restart ends
		// watches against it.
		{"kubectl get -w still live", func(t *testing.T) { e.checkLiveWatch(t, long, liveWatchFor) }},
		{"faults", func(t *testing.T) { e.faults(t, tierKubeconfig) }},
		{"delete", func(t *testing.T) { e.deleteProfile(t) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			t.Fatalf("step %q failed; the later steps depend on it", s.name)
		}
	}
}

// install: the operator from its image, data, the sample profile, and the
// fleet turning Available on its pods' real readiness.
func (e *env) install(t *testing.T, pauseImage string) string {
	ctx := context.Background()
	took, err := e.in.InstallOperator(ctx, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply -k config/default → manager pod Ready: %s", took.Round(time.Second))
	if err := e.in.Seed(ctx, pauseImage); err != nil {
		t.Fatal(err)
	}
	p, available, err := e.in.ApplySample(ctx, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply -k config/samples → profile Available: %s", available.Round(100*time.Millisecond))

	if msg, ok := e.in.APIServiceAvailable(ctx, p.Status.APIServiceName); !ok {
		t.Fatalf("APIService %s: %s", p.Status.APIServiceName, msg)
	}
	slices, err := e.kc.DiscoveryV1().EndpointSlices(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + profileName + "-front"})
	if err != nil || len(slices.Items) == 0 {
		t.Fatalf("no EndpointSlice for the front Service (the EndpointSlice controller's): %v", err)
	}
	ready := 0
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				ready++
			}
		}
	}
	if ready != int(p.Spec.FrontReplicas) {
		t.Fatalf("front EndpointSlices list %d ready endpoints, want %d", ready, p.Spec.FrontReplicas)
	}
	if got := fmt.Sprintf("%d/%d", p.Spec.Shards, p.Spec.Shards); p.Status.Ready != got {
		t.Fatalf("status.ready %q, want %q", p.Status.Ready, got)
	}
	if !strings.HasSuffix(p.Status.ServerURL, "/apis/"+group+"/v1alpha1/watch") {
		t.Fatalf("status.serverURL %q does not end in the profile's aggregated path", p.Status.ServerURL)
	}
	mem, err := e.in.PodMemory(ctx, operatorNamespace)
	if err != nil {
		t.Fatalf("pod memory from the kubelet: %v", err)
	}
	t.Logf("working-set memory per pod after the sample profile turned Available:\n%s", nodeinstall.FormatMemory(mem))
	t.Logf("kubectl get cacheprofiles -o wide:\n%s", e.mustKubectl(t, e.kubeconfig, "get", "cacheprofiles", "-o", "wide"))
	return e.kubeconfigFor(t, e.kubeconfig, p.Status.ServerURL, "kubeconfig-tier")
}

// pageRequest matches the page requests kubectl -v=6 logs.
var pageRequest = regexp.MustCompile(`verb="GET" url="https://[^"]+/configmaps\?(continue=[^"&]+&)?limit=50" status="200 OK"`)

// readWithKubectl: the commands a person types, through status.serverURL,
// give the apiserver's items.
func (e *env) readWithKubectl(t *testing.T, tier string) {
	cases := [][]string{
		{"get", "pods", "-A"},
		{"get", "pods", "-n", cachedNamespaces[1]},
		{"get", "pods", "-A", "-l", "app=web"},
		{"get", "pods", "-A", "--field-selector", "spec.nodeName=" + nodeName},
		{"get", "pods", "-A", "--field-selector", "status.phase=Pending"},
		{"get", "configmaps", "-n", cachedNamespaces[0], "-l", "app=b,tier=y"},
		{"get", "configmaps", "-n", cachedNamespaces[2]},
		{"get", "configmaps", "-n", cachedNamespaces[1], "--field-selector", "metadata.name=cm-007"},
	}
	for _, args := range cases {
		t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
			n := e.compareJSON(t, e.kubeconfig, tier, args...)
			t.Logf("%d items", n)
		})
	}
	// The sample caches the Certificates without cachetier.io/skip: the
	// tier's whole list is the apiserver's list with that selector.
	t.Run("certificates selected by the profile", func(t *testing.T) {
		skip := "!cachetier.io/skip"
		e.compareJSONAs(t, e.kubeconfig, tier, []string{"get", "certificates.cert-manager.io", "-A", "-l", skip}, []string{"get", "certificates.cert-manager.io", "-A"})
		e.compareJSONAs(t, e.kubeconfig, tier, []string{"get", "certificates.cert-manager.io", "-A", "-l", skip + ",team=red"}, []string{"get", "certs", "-A", "-l", "team=red"})
	})
	// The profile caches configmaps of the labelled namespaces only: all of
	// them, paged, are the apiserver's configmaps of those namespaces.
	t.Run("chunked", func(t *testing.T) {
		args := []string{"get", "configmaps", "-A", "--chunk-size=50", "-o", "name"}
		var want string
		for _, ns := range cachedNamespaces {
			want += e.mustKubectl(t, e.kubeconfig, "get", "configmaps", "-n", ns, "-o", "name")
		}
		r := e.kubectl(t, tier, append(args, "-v=6")...)
		if r.err != nil {
			t.Fatalf("%s", r)
		}
		if r.stdout != want {
			t.Fatalf("chunked output differs:\ntier:\n%s\napiserver:\n%s", clip(r.stdout), clip(want))
		}
		pages := pageRequest.FindAllString(r.stderr, -1)
		if min := len(cachedNamespaces) * nodeinstall.ConfigMapsPerNamespace / 50; len(pages) < min {
			t.Fatalf("%d page requests, want at least %d:\n%s", len(pages), min, clip(r.stderr))
		}
		for _, p := range pages {
			if !strings.Contains(p, "/apis/"+group+"/v1alpha1/watch/api/v1/configmaps?") {
				t.Fatalf("page not read through the profile's path: %s", p)
			}
		}
	})
	t.Run("writes refused", func(t *testing.T) {
		r := e.kubectl(t, tier, "delete", "configmap", "cm-000", "-n", cachedNamespaces[0])
		if r.err == nil || !strings.Contains(r.stderr, "read-only") {
			t.Fatalf("want the tier's read-only refusal, got %s", r)
		}
	})
}

// readAsLimitedUser: a user RBAC lets read configmaps of one namespace reads
// them through the tier, and gets the apiserver's own 403s for the rest.
func (e *env) readAsLimitedUser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cachedNamespaces[1]
	rbac := e.kc.RbacV1()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	must(rbac.Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "configmap-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}))
	must(rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "configmap-reader-erin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
	}, metav1.CreateOptions{}))
	// The apiserver authorizes the profile's path itself first (verb watch
	// on the profile's group below status.serverURL): erin is bound to the
	// reader ClusterRole the operator renders for the profile.
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cachetier-" + profileName + "-reader-erin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cachetier:" + profileName + ":reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
	}, metav1.CreateOptions{}))
	erin, err := e.c.UserKubeconfig("erin", "developers")
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.profile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	erinTier := e.kubeconfigFor(t, erin, p.Status.ServerURL, "kubeconfig-erin-tier")
	// RBAC reaches the authorizers' caches within moments.
	deadline := time.Now().Add(30 * time.Second)
	for r := e.kubectl(t, erinTier, "get", "configmaps", "-n", ns, "-o", "name"); r.err != nil; r = e.kubectl(t, erinTier, "get", "configmaps", "-n", ns, "-o", "name") {
		if time.Now().After(deadline) {
			t.Fatalf("erin cannot read %s configmaps through the tier: %s", ns, r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.compareJSON(t, erin, erinTier, "get", "configmaps", "-n", ns)
	e.sameRefusals(t, "erin", erin, erinTier, [][]string{
		{"get", "configmaps", "-n", cachedNamespaces[0]},
		{"get", "configmaps", "-A"},
		{"get", "pods", "-n", ns},
		{"get", "configmap", "cm-001", "-n", cachedNamespaces[2]},
	})

	// The reader ClusterRole is aggregated into view (and edit, admin):
	// vera, who may view the whole cluster, reads through the tier without
	// RBAC of her own for it, what view lets her read, and gets the
	// apiserver's 403 for the rest (view has nothing of cert-manager's
	// group here: no ClusterRole of it is aggregated into view).
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "view-vera"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "vera"}},
	}, metav1.CreateOptions{}))
	vera, err := e.c.UserKubeconfig("vera", "viewers")
	if err != nil {
		t.Fatal(err)
	}
	veraTier := e.kubeconfigFor(t, vera, p.Status.ServerURL, "kubeconfig-vera-tier")
	deadline = time.Now().Add(30 * time.Second)
	for r := e.kubectl(t, veraTier, "get", "pods", "-n", ns, "-o", "name"); r.err != nil; r = e.kubectl(t, veraTier, "get", "pods", "-n", ns, "-o", "name") {
		if time.Now().After(deadline) {
			t.Fatalf("vera (view) cannot read %s pods through the tier: %s", ns, r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.compareJSON(t, vera, veraTier, "get", "pods", "-A")
	e.compareJSON(t, vera, veraTier, "get", "configmaps", "-n", ns)
	e.sameRefusals(t, "vera", vera, veraTier, [][]string{{"get", "certificates.cert-manager.io", "-n", ns}, {"get", "certs", "-A"}})
}

// sameRefusals: each command is refused to the user by the apiserver, and
// through the tier with the same message.
func (e *env) sameRefusals(t *testing.T, user, direct, tier string, cmds [][]string) {
	t.Helper()
	for _, args := range cmds {
		want := e.kubectl(t, direct, args...)
		got := e.kubectl(t, tier, args...)
		if want.err == nil || !strings.Contains(want.stderr, "Forbidden") {
			t.Fatalf("the apiserver let %s %v: %s", user, args, want)
		}
		if got.err == nil || got.stderr != want.stderr {
			t.Fatalf("kubectl %v as %s: the tier's answer differs from the apiserver's\ntier:      %q\napiserver: %q", args, user, got.stderr, want.stderr)
		}
	}
}

// informersBothWays: typed and metadata informers through the tier, with
// client-go's WatchListClient feature on and off, hold what the apiserver
// holds.
func (e *env) informersBothWays(t *testing.T, tier string) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("WatchListClient=%v", watchList), func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, watchList)
			r := startReaders(t, restConfig(t, tier))
			defer r.Stop()
			e.waitSame(t, r, time.Minute)
		})
	}
}

// faults: what happens to a fleet in production, with informers reading
// through the tier and a writer changing data the whole time; at the end
// the informers must hold exactly what the apiserver holds.
func (e *env) faults(t *testing.T, tier string) {
	r := startReaders(t, restConfig(t, tier))
	defer r.Stop()
	w := clients.StartWriter(e.kc, cachedNamespaces)
	defer w.Halt()
	ctx := context.Background()

	t.Run("delete a shard pod", func(t *testing.T) {
		shard := profileName + "-shard-0"
		degraded := e.watchDegraded(shard)
		defer degraded.stop()
		start := time.Now()
		if err := e.kc.CoreV1().Pods(operatorNamespace).Delete(ctx, shard+"-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitProfile(t, "Available again", 3*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
			d, ok := settled(p)
			return d, ok && degraded.seen() != "" && allShardsReady(p)
		})
		t.Logf("Degraded while the pod was replaced: %q; Available again after %s", degraded.seen(), time.Since(start).Round(100*time.Millisecond))
	})
	t.Run("delete a front pod", func(t *testing.T) {
		pods, err := e.kc.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=front"})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("front pods: %v", err)
		}
		// Reads through the aggregator go on while a front goes away: the
		// other front answers them all.
		reads := clients.StartReads(restConfig(t, tier), cachedNamespaces)
		defer reads.Stop()
		if err := e.kc.CoreV1().Pods(operatorNamespace).Delete(ctx, pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitFrontPodGone(t, pods.Items[0].Name)
		e.waitProfile(t, "Available again", 3*time.Minute, settled)
		res := reads.Stop()
		ok, failed := res.OK, res.Failed
		t.Logf("consistent reads through the tier while a front was replaced: %s", res)
		if len(failed) > 0 || ok == 0 {
			t.Errorf("reads failed while a front pod was deleted (%d answered): %v", ok, failed)
		}
	})
	t.Run("scale shards 2 to 3 to 2", func(t *testing.T) {
		var reads *clients.Reads
		for _, n := range []int{3, 2} {
			if n == 2 {
				// Reads keep going through the tier while it shrinks; no
				// front may be left dialling the shard that is removed.
				reads = clients.StartReads(restConfig(t, tier), cachedNamespaces)
				defer reads.Stop()
			}
			e.patchProfile(t, map[string]any{"shards": n})
			p := e.waitProfile(t, fmt.Sprintf("Available with %d shards", n), 6*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
				d, ok := settled(p)
				return d + fmt.Sprintf(", %d shard statuses", len(p.Status.Shards)), ok && len(p.Status.Shards) == n && allShardsReady(p)
			})
			e.waitStatefulSets(t, n)
			t.Logf("shards %d: %s", n, p.Status.Ready)
		}
		res := reads.Stop()
		t.Logf("consistent reads through the tier while the fleet shrank: %s", res)
		for msg := range res.Failed {
			if strings.Contains(msg, profileName+"-shard-2 is unreachable") {
				t.Errorf("a front read the removed shard: %s", msg)
			}
		}
	})
	t.Run("change a spec field", func(t *testing.T) {
		changed := time.Now().Truncate(time.Second)
		e.patchProfile(t, map[string]any{"freshnessTimeout": "4s"})
		e.waitProfile(t, "rolled out", 6*time.Minute, settled)
		// Shards and fronts act on the freshness timeout: every pod is new.
		e.waitPodsCreatedSince(t, changed)
	})
	t.Run("kill the manager mid-reconcile", func(t *testing.T) {
		// The leader, of config/default's two replicas: the other takes
		// over once the killed one's lease expires.
		leader, err := e.in.Leader(ctx)
		if err != nil {
			t.Fatalf("leader: %v", err)
		}
		e.patchProfile(t, map[string]any{"frontReplicas": 3})
		if err := e.kc.CoreV1().Pods(operatorNamespace).Delete(ctx, leader.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		p := e.waitProfile(t, "Available with 3 fronts", 5*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
			d, ok := settled(p)
			return d, ok && p.Status.FrontReadyReplicas == 3
		})
		t.Logf("front ready replicas %d after the manager was replaced", p.Status.FrontReadyReplicas)
		e.patchProfile(t, map[string]any{"frontReplicas": 2})
		e.waitProfile(t, "Available with 2 fronts", 3*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
			d, ok := settled(p)
			return d, ok && p.Status.FrontReadyReplicas == 2
		})
	})
	t.Run("rotate the serving certificate", func(t *testing.T) {
		secret := profileName + "-serving-cert"
		old, err := e.kc.CoreV1().Secrets(operatorNamespace).Get(ctx, secret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		oldSerial := certSerial(t, old.Data["tls.crt"])
		if err := e.kc.CoreV1().Secrets(operatorNamespace).Delete(ctx, secret, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var newSerial string
		e.waitProfile(t, "Available with a new serving certificate", 5*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
			d, ok := settled(p)
			s, err := e.kc.CoreV1().Secrets(operatorNamespace).Get(ctx, secret, metav1.GetOptions{})
			if err != nil {
				return d + "; " + err.Error(), false
			}
			newSerial = certSerial(t, s.Data["tls.crt"])
			served := e.frontServedSerial(ctx)
			return fmt.Sprintf("%s; secret serial %s, front serves %s", d, newSerial, served), ok && newSerial != oldSerial && served == newSerial
		})
	})

	w.Halt()
	if w.Writes.Load() == 0 || w.Errs.Load() > w.Writes.Load()/10 {
		t.Fatalf("writer: %d writes, %d errors", w.Writes.Load(), w.Errs.Load())
	}
	e.waitSame(t, r, clients.Converge)
	t.Logf("informers equal to the apiserver after the faults (%d writes during them)", w.Writes.Load())
	// The profile caches configmaps of the labelled namespaces only.
	for _, ns := range cachedNamespaces {
		e.compareJSON(t, e.kubeconfig, tier, "get", "configmaps", "-n", ns)
	}
}

func allShardsReady(p *cachev1alpha1.CacheProfile) bool {
	for _, s := range p.Status.Shards {
		if s.ReadyReplicas != s.Replicas {
			return false
		}
	}
	return len(p.Status.Shards) > 0
}

// degradedWatch records the first Degraded message that names a shard.
type degradedWatch struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	msg    string
}

func (e *env) watchDegraded(shard string) *degradedWatch {
	ctx, cancel := context.WithCancel(context.Background())
	d := &degradedWatch{cancel: cancel}
	go func() {
		for ctx.Err() == nil {
			if p, err := e.profile(ctx); err == nil {
				if c := apimeta.FindStatusCondition(p.Status.Conditions, cachev1alpha1.ConditionDegraded); c != nil &&
					c.Status == metav1.ConditionTrue && strings.Contains(c.Message, shard) {
					d.mu.Lock()
					if d.msg == "" {
						d.msg = c.Reason + ": " + c.Message
					}
					d.mu.Unlock()
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return d
}

func (d *degradedWatch) seen() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.msg
}

func (d *degradedWatch) stop() { d.cancel() }

func (e *env) waitFrontPodGone(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := e.kc.CoreV1().Pods(operatorNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("front pod %s not gone: %v", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitStatefulSets waits until exactly n shard StatefulSets exist: surplus
// ones are removed once the others serve their hash shards.
func (e *env) waitStatefulSets(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		list, err := e.kc.AppsV1().StatefulSets(operatorNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "cachetier.io/profile=" + profileName})
		if err == nil && len(list.Items) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard StatefulSets: want %d, have %d (%v)\n%s", n, len(list.Items), err, e.diagnose())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitPodsCreatedSince waits until every fleet pod was created at or
// after t0: the change reached the pods, not just their templates.
func (e *env) waitPodsCreatedSince(t *testing.T, t0 time.Time) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pods, err := e.kc.CoreV1().Pods(operatorNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "cachetier.io/profile=" + profileName})
		var old []string
		if err == nil {
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.CreationTimestamp.Time.Before(t0) {
					old = append(old, p.Name)
				}
			}
		}
		if err == nil && len(old) == 0 && len(pods.Items) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods from before the change still run: %v (%v)", old, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func certSerial(t *testing.T, pemBytes []byte) string {
	t.Helper()
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// frontServedSerial is the serial of the certificate the front Service's
// ClusterIP presents right now (any replica behind it).
func (e *env) frontServedSerial(ctx context.Context) string {
	svc, err := e.kc.CoreV1().Services(operatorNamespace).Get(ctx, profileName+"-front", metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: &tls.Config{InsecureSkipVerify: true}} // only reading what is presented
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port)))
	if err != nil {
		return err.Error()
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// deleteProfile: deleting the profile removes every child, cluster-scoped
// ones and the kube-system RoleBinding included, and the fleet's pods.
func (e *env) deleteProfile(t *testing.T) {
	if err := e.in.DeleteSample(context.Background(), 3*time.Minute); err != nil {
		t.Fatal(err)
	}
}

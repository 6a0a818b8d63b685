// Package watchindex tests node-scoped watches — a kubelet's
// fieldSelector=spec.nodeName=<node>, which the tier dispatches by index —
// against a real kube-apiserver, on the standalone tier and on a fleet of
// two shards behind a front: while pods are created, bound to nodes (the
// pods/binding subresource), moved (deleted and re-created on another
// node: spec.nodeName is immutable once set), updated and deleted, every
// watcher through the tier must receive exactly the events the same watch
// on the apiserver receives, and end equal to the apiserver's LIST of its
// node.
package watchindex

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

var standalone, fleet *tiertest.Env

func TestMain(m *testing.M) {
	os.Exit(tiertest.Run(m, tiertest.Options{
		ProfileName: "watchindex", ServiceClusterIPRange: "127.86.0.0/24",
		// No fieldIndexes in the profile: pods' spec.nodeName is indexed
		// because the apiserver indexes it.
		Spec:        v1alpha1.CacheProfileSpec{HashShards: 4, Resources: []v1alpha1.CachedResource{{Version: "v1", Resource: "pods"}}},
		FleetShards: 2, FleetReplicas: 1,
	}, func(e *tiertest.Env) { standalone, fleet = e, e.Fleet() }))
}

const nodes = 10

// event is what a comparison looks at: type, key and resourceVersion.
type event struct{ typ, key, rv string }

func (e event) String() string { return e.typ + " " + e.key + "@" + e.rv }

// recorder reads a watch into a list of events.
type recorder struct {
	name   string
	mu     sync.Mutex
	events []event
	err    error
}

func record(name string, w watch.Interface) *recorder {
	r := &recorder{name: name}
	go func() {
		for ev := range w.ResultChan() {
			r.mu.Lock()
			switch p, ok := ev.Object.(*corev1.Pod); {
			case ev.Type == watch.Error:
				r.err = fmt.Errorf("%s: error event %v", name, ev.Object)
			case ok: // a BOOKMARK too: none was asked for
				r.events = append(r.events, event{string(ev.Type), p.Namespace + "/" + p.Name, p.ResourceVersion})
			}
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *recorder) snapshot() ([]event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events), r.err
}

// has says whether the recorder received an ADDED of key.
func (r *recorder) has(key string) bool {
	evs, _ := r.snapshot()
	return slices.ContainsFunc(evs, func(e event) bool { return e.typ == "ADDED" && e.key == key })
}

// kubelet is a kubelet's pod source: LIST RV=0 of its node from the tier,
// then WATCH from the list's RV; its state is pod name → RV.
type kubelet struct {
	mu    sync.Mutex
	pods  map[string]string
	err   error
	watch watch.Interface
}

func startKubelet(ctx context.Context, t *testing.T, kc kubernetes.Interface, sel string) *kubelet {
	list, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{pods: map[string]string{}}
	for _, p := range list.Items {
		k.pods[p.Namespace+"/"+p.Name] = p.ResourceVersion
	}
	if k.watch, err = kc.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range k.watch.ResultChan() {
			k.mu.Lock()
			switch p, _ := ev.Object.(*corev1.Pod); ev.Type {
			case watch.Added, watch.Modified:
				k.pods[p.Namespace+"/"+p.Name] = p.ResourceVersion
			case watch.Deleted:
				delete(k.pods, p.Namespace+"/"+p.Name)
			case watch.Error:
				k.err = fmt.Errorf("error event %v", ev.Object)
			}
			k.mu.Unlock()
		}
	}()
	return k
}

func (k *kubelet) state() (map[string]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.pods), k.err
}

func TestNodeScopedWatches(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	for _, tier := range []struct {
		name string
		env  *tiertest.Env
	}{{"standalone", standalone}, {"fleet", fleet}} {
		t.Run(tier.name, func(t *testing.T) { testNodeScopedWatches(t, tier.env, tier.name) })
	}
}

func testNodeScopedWatches(t *testing.T, env *tiertest.Env, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	api := kubernetes.NewForConfigOrDie(env.Admin)
	tierCfg := rest.CopyConfig(env.TierAdmin)
	tierCfg.QPS, tierCfg.Burst = 1000, 2000
	tier := kubernetes.NewForConfigOrDie(tierCfg)
	if _, err := api.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The nodes are this run's own, so the other run's pods stay out.
	node := func(i int) string { return fmt.Sprintf("%s-node-%d", ns, i) }
	w := &workload{t: t, ctx: ctx, api: api, ns: ns, rnd: rand.New(rand.NewPCG(20, 26)), node: node, pods: map[string]*corev1.Pod{}}
	for range 40 {
		w.create("")
	}
	list, err := api.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv0 := list.ResourceVersion

	// The selectors watched: every node, the namespace's unbound pods
	// (the scheduler's spec.nodeName=), and an unindexed label selector.
	type scope struct {
		name, ns string
		opts     metav1.ListOptions
	}
	var scopes []scope
	for i := range nodes {
		scopes = append(scopes, scope{"node " + node(i), "", metav1.ListOptions{FieldSelector: "spec.nodeName=" + node(i)}})
	}
	scopes = append(scopes,
		scope{"unbound", ns, metav1.ListOptions{FieldSelector: "spec.nodeName="}},
		scope{"app=a", ns, metav1.ListOptions{LabelSelector: "app=a"}},
	)
	type pair struct{ api, tier *recorder }
	var pairs []pair
	var kubelets []*kubelet
	var stores []cache.Store
	for _, s := range scopes {
		opts := s.opts
		opts.ResourceVersion = rv0
		aw, err := api.CoreV1().Pods(s.ns).Watch(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		tw, err := tier.CoreV1().Pods(s.ns).Watch(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer aw.Stop()
		defer tw.Stop()
		pairs = append(pairs, pair{record("apiserver "+s.name, aw), record("tier "+s.name, tw)})
		if s.ns == "" {
			k := startKubelet(ctx, t, tier, s.opts.FieldSelector)
			defer k.watch.Stop()
			kubelets = append(kubelets, k)
			// A watch-list informer of the node.
			sel := s.opts.FieldSelector
			f := informers.NewSharedInformerFactoryWithOptions(tier, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel }))
			inf := f.Core().V1().Pods().Informer()
			stop := make(chan struct{})
			f.Start(stop)
			defer func() { close(stop); f.Shutdown() }()
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				t.Fatalf("informer of %s did not sync", s.name)
			}
			stores = append(stores, inf.GetStore())
		}
	}
	// The tier dispatches the node-scoped watchers by index (the raw
	// watch, the kubelet's and the informer's of every node, and the
	// unbound one); the label selector's is unindexed.
	if v := metric(t, env, `cachetier_watch_dispatch_watchers{resource="pods",type="indexed"}`); v < 3*nodes+1 {
		t.Errorf("indexed watchers: %v, want at least %d", v, 3*nodes+1)
	}

	for range 300 {
		w.step()
	}
	// Markers: the last change each watcher sees; once it arrived,
	// everything before it did.
	markers := map[string]string{}
	for i := range nodes {
		markers["node "+node(i)] = w.createNamed("marker-"+node(i), node(i), "b").key()
	}
	markers["unbound"] = w.createNamed("marker-unbound", "", "b").key()
	markers["app=a"] = w.createNamed("marker-app", node(0), "a").key()

	total := 0
	for i, p := range pairs {
		marker := markers[scopes[i].name]
		waitFor(t, ctx, p.api.name, func() bool { return p.api.has(marker) })
		waitFor(t, ctx, p.tier.name, func() bool { return p.tier.has(marker) })
		want, err := p.api.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.tier.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		// Up to the marker: a later change may have reached one of the
		// two watchers only.
		want, got = upTo(want, marker), upTo(got, marker)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %d events, the apiserver's %d\n%s", p.tier.name, len(got), len(want), difference(got, want))
		}
		total += len(want)
	}
	if total < 200 {
		t.Errorf("only %d events in all: the workload did not reach the watchers", total)
	}
	for i := range nodes {
		sel := "spec.nodeName=" + node(i)
		truth, err := api.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for _, p := range truth.Items {
			want[p.Namespace+"/"+p.Name] = p.ResourceVersion
		}
		waitFor(t, ctx, "kubelet of "+node(i), func() bool {
			got, err := kubelets[i].state()
			if err != nil {
				t.Fatal(err)
			}
			return maps.Equal(got, want)
		})
		waitFor(t, ctx, "informer of "+node(i), func() bool {
			got := map[string]string{}
			for _, o := range stores[i].List() {
				p := o.(*corev1.Pod)
				got[p.Namespace+"/"+p.Name] = p.ResourceVersion
			}
			return maps.Equal(got, want)
		})
	}
	t.Logf("%d changes; %d watchers compared", w.changes, len(pairs)*2+len(kubelets)+len(stores))
}

// upTo is evs up to and including the ADDED of key.
func upTo(evs []event, key string) []event {
	i := slices.IndexFunc(evs, func(e event) bool { return e.typ == "ADDED" && e.key == key })
	return evs[:i+1]
}

func metric(t *testing.T, env *tiertest.Env, series string) float64 {
	t.Helper()
	s, err := env.Metric(series)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := strconv.ParseFloat(s, 64)
	return v
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not reached before the test's deadline", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func difference(got, want []event) string {
	for i := range max(len(got), len(want)) {
		g, w := "(none)", "(none)"
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		if g != w {
			return fmt.Sprintf("first difference at %d: tier %s, apiserver %s", i, g, w)
		}
	}
	return ""
}

// workload changes pods in the namespace through the apiserver.
type workload struct {
	t       *testing.T
	ctx     context.Context
	api     kubernetes.Interface
	ns      string
	rnd     *rand.Rand
	node    func(int) string
	pods    map[string]*corev1.Pod
	next    int
	changes int
}

type podRef struct{ ns, name string }

func (p podRef) key() string { return p.ns + "/" + p.name }

func (w *workload) randomNode() string { return w.node(w.rnd.IntN(nodes)) }

func (w *workload) create(node string) podRef {
	w.next++
	return w.createNamed(fmt.Sprintf("p-%d", w.next), node, []string{"a", "b"}[w.rnd.IntN(2)])
}

func (w *workload) createNamed(name, node, app string) podRef {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Labels: map[string]string{"app": app}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
	}
	created, err := w.api.CoreV1().Pods(w.ns).Create(w.ctx, p, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.pods[name] = created
	w.changes++
	return podRef{w.ns, name}
}

// pick is a random pod that satisfies ok (nil: none).
func (w *workload) pick(ok func(*corev1.Pod) bool) *corev1.Pod {
	var names []string
	for n, p := range w.pods {
		if ok(p) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return w.pods[names[w.rnd.IntN(len(names))]]
}

func (w *workload) delete(p *corev1.Pod, grace int64) {
	if err := w.api.CoreV1().Pods(w.ns).Delete(w.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(grace)}); err != nil {
		w.t.Fatal(err)
	}
	w.changes++
	if grace == 0 {
		delete(w.pods, p.Name)
		return
	}
	got, err := w.api.CoreV1().Pods(w.ns).Get(w.ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.pods[p.Name] = got
}

func (w *workload) refresh(name string) {
	got, err := w.api.CoreV1().Pods(w.ns).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.pods[name] = got
}

// step makes one random change.
func (w *workload) step() {
	pending := func(p *corev1.Pod) bool { return p.Spec.NodeName == "" }
	bound := func(p *corev1.Pod) bool { return p.Spec.NodeName != "" && p.DeletionTimestamp == nil }
	terminating := func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil }
	switch r := w.rnd.IntN(100); {
	case r < 15 || len(w.pods) < 20:
		w.create("")
	case r < 25:
		w.create(w.randomNode())
	case r < 40: // a pending pod gains its node
		if p := w.pick(pending); p != nil {
			b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: w.ns}, Target: corev1.ObjectReference{Kind: "Node", Name: w.randomNode()}}
			if err := w.api.CoreV1().Pods(w.ns).Bind(w.ctx, b, metav1.CreateOptions{}); err != nil {
				w.t.Fatal(err)
			}
			w.changes++
			w.refresh(p.Name)
		}
	case r < 55: // labels change (in and out of app=a)
		if p := w.pick(func(p *corev1.Pod) bool { return p.DeletionTimestamp == nil }); p != nil {
			p = p.DeepCopy()
			p.Labels["app"] = []string{"a", "b"}[w.rnd.IntN(2)]
			p.Annotations = map[string]string{"step": fmt.Sprint(w.changes)}
			updated, err := w.api.CoreV1().Pods(w.ns).Update(w.ctx, p, metav1.UpdateOptions{})
			if err != nil {
				w.t.Fatal(err)
			}
			w.changes++
			w.pods[p.Name] = updated
		}
	case r < 62: // status
		if p := w.pick(bound); p != nil {
			p = p.DeepCopy()
			p.Status.Phase = []corev1.PodPhase{corev1.PodRunning, corev1.PodPending}[w.rnd.IntN(2)]
			updated, err := w.api.CoreV1().Pods(w.ns).UpdateStatus(w.ctx, p, metav1.UpdateOptions{})
			if err != nil {
				w.t.Fatal(err)
			}
			w.changes++
			w.pods[p.Name] = updated
		}
	case r < 75: // moved: deleted and re-created on another node
		if p := w.pick(bound); p != nil {
			w.delete(p, 0)
			w.createNamed(p.Name, w.randomNode(), p.Labels["app"])
		}
	case r < 82: // a kubelet's graceful deletion: terminating first
		if p := w.pick(bound); p != nil {
			w.delete(p, 30)
		}
	case r < 90: // deletions finish
		if p := w.pick(terminating); p != nil {
			w.delete(p, 0)
		} else if p := w.pick(pending); p != nil {
			w.delete(p, 0)
		}
	default:
		if p := w.pick(func(*corev1.Pod) bool { return true }); p != nil {
			w.delete(p, 0)
		}
	}
}

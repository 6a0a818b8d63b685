package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	apiregclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/e2e/internal/clients"
	"github.com/cachetier/cachetier/hack/controlplane"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// TestNodes is the fleet on three nodes, step by step; each step needs the
// ones before it. Informers (typed and metadata, with client-go's
// WatchListClient on), a writer and a reader loop run from the install to
// the end.
func TestNodes(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, true)
	e := startCluster(t)
	var run *running
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"install", func(t *testing.T) { run = e.install(t) }},
		{"drain each node", func(t *testing.T) { e.drainEach(t, run) }},
		{"a node dies", func(t *testing.T) { e.nodeDies(t, run) }},
		{"the leader's node dies", func(t *testing.T) { e.leadersNodeDies(t, run) }},
		{"informers equal the apiserver", func(t *testing.T) { e.informersEqual(t, run) }},
		{"delete", func(t *testing.T) {
			if err := e.in.DeleteSample(context.Background(), 3*time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			if run != nil {
				run.stop()
			}
			t.Fatalf("step %q failed; the later steps depend on it", s.name)
		}
	}
}

// running are the clients that read and write all along.
type running struct {
	informers *clients.Informers
	writer    *clients.Writer
	reads     *clients.Reads
	stopped   bool
}

func (r *running) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	r.writer.Halt()
	r.reads.Stop()
	r.informers.Stop()
}

// install: the operator with `kubectl apply -k config/default` (two
// managers), sample data, `kubectl apply -k config/samples` (2 shards x 2
// replicas, 2 fronts), Available on the pods' readiness; no two replicas
// of a shard, fronts or managers on one node. Then the clients start.
func (e *env) install(t *testing.T) *running {
	ctx := context.Background()
	took, err := e.in.InstallOperator(ctx, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply -k config/default → manager pods Ready: %s", took.Round(time.Second))
	if err := e.in.Seed(ctx, e.pause); err != nil {
		t.Fatal(err)
	}
	p, took, err := e.in.ApplySample(ctx, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply -k config/samples → profile Available: %s", took.Round(100*time.Millisecond))
	if p.Spec.Shards != 2 || p.Spec.ReplicasPerShard != 2 || p.Spec.FrontReplicas != 2 {
		t.Fatalf("config/samples is %d shards x %d replicas, %d fronts; this test is written for 2 x 2, 2", p.Spec.Shards, p.Spec.ReplicasPerShard, p.Spec.FrontReplicas)
	}
	where, err := e.placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("placement:\n%s", where)
	t.Logf("resident memory of each node's processes:\n%s", e.nodeMemory())
	if mem, err := e.in.PodMemory(ctx, operatorNamespace); err == nil {
		t.Logf("working-set memory per pod:\n%s", nodeinstall.FormatMemory(mem))
	}
	e.tier = e.tierConfig(t, p.Status.ServerURL)
	run := &running{informers: clients.StartInformers(t, e.tier)}
	run.writer = clients.StartWriter(e.kc, cachedNamespaces)
	run.reads = clients.StartReads(e.tier, cachedNamespaces)
	return run
}

// drainEach: `kubectl drain` each node in turn, then uncordon it. Each
// drain completes; the PDBs hold it back while a replacement loads, so
// that at no sampled moment a shard is without a ready replica; reads
// keep answering.
func (e *env) drainEach(t *testing.T, run *running) {
	ctx := context.Background()
	for _, n := range e.c.Nodes {
		before := run.reads.Results()
		sampler := e.sampleShards(2)
		start := time.Now()
		// --force: the sample's bare pods (no controller) go too, as a
		// person draining a node with such pods has to say.
		e.kubectl(t, "drain", n.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=5m")
		drained := time.Since(start)
		left, err := e.kc.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range left.Items {
			if p.DeletionTimestamp == nil {
				t.Errorf("pod %s still on %s after the drain", p.Name, n.Name)
			}
		}
		e.kubectl(t, "uncordon", n.Name)
		e.waitProfile(t, "settled after draining "+n.Name, 3*time.Minute, settledEverywhere)
		samples, gaps := sampler.stop()
		reads := run.reads.Results().Since(before)
		t.Logf("drain %s: %s (settled %s after the drain began); %d samples of shard readiness; reads: %s",
			n.Name, drained.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond), samples, reads)
		if len(gaps) > 0 {
			t.Errorf("draining %s left shards without a ready replica:\n%s", n.Name, strings.Join(gaps, "\n"))
		}
		// A drain is voluntary: every pod leaves gracefully (a front
		// after its preStop, the aggregator's connection to it closed
		// with GOAWAY), one replica of a shard at a time — no read may
		// fail.
		if failed := reads.FailedReads(); failed > 0 {
			t.Errorf("%d reads failed while %s was drained:\n%s", failed, n.Name, clients.SortedCounts(reads.Failed))
		}
		if samples < 10 {
			t.Errorf("only %d samples of shard readiness while draining %s", samples, n.Name)
		}
		where, err := e.placement(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("placement after draining %s:\n%s", n.Name, where)
	}
}

// victim is a node with a shard replica and a front, not the leading
// manager's (its loss is the next step's) when another qualifies.
func (e *env) victim(t *testing.T) string {
	ctx := context.Background()
	pods, err := e.fleetPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader, err := e.in.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var candidates []string
	for _, n := range e.c.Nodes {
		shard, front := false, false
		for _, p := range pods {
			if p.Spec.NodeName == n.Name {
				shard = shard || p.Labels["app.kubernetes.io/component"] == "shard"
				front = front || p.Labels["app.kubernetes.io/component"] == "front"
			}
		}
		if shard && front {
			candidates = append(candidates, n.Name)
		}
	}
	if len(candidates) == 0 {
		t.Fatal("no node runs both a shard replica and a front")
	}
	for _, c := range candidates {
		if c != leader.Spec.NodeName {
			return c
		}
	}
	return candidates[0]
}

// nodeDies: a node with a shard replica and a front dies as a machine
// does. Reads keep answering; the profile goes Degraded naming the node,
// then Available again on the remaining nodes; the node comes back and
// no healthy pod is restarted.
func (e *env) nodeDies(t *testing.T, run *running) {
	ctx := context.Background()
	name := e.victim(t)
	states, err := e.podStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := e.fleetPods(ctx)
	var onVictim []string
	for _, p := range pods {
		if p.Spec.NodeName == name {
			onVictim = append(onVictim, p.Name)
			delete(states, p.Name) // replaced: not the healthy pods
		}
	}
	before := run.reads.Results()
	start := time.Now()
	if err := e.c.StopNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped %s, which ran %v", name, onVictim)
	var degraded string
	var degradedAfter time.Duration
	p := e.waitProfile(t, "Degraded naming "+name+", then settled on the other nodes", 6*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
		if c := apimeta.FindStatusCondition(p.Status.Conditions, cachev1alpha1.ConditionDegraded); degraded == "" && c != nil &&
			c.Status == metav1.ConditionTrue && strings.Contains(c.Message, name) {
			degraded, degradedAfter = c.Reason+": "+c.Message, time.Since(start)
		}
		d, ok := settledEverywhere(p)
		return d, ok && degraded != ""
	})
	available := time.Since(start)
	t.Logf("Degraded %s after the node died: %s", degradedAfter.Round(100*time.Millisecond), degraded)
	t.Logf("settled (Available, not Degraded, %s shards ready, fronts %s) %s after the node died", p.Status.Ready, p.Status.Front, available.Round(100*time.Millisecond))
	for _, sh := range strings.Split("shard-0 shard-1 front", " ") {
		if !strings.Contains(degraded, profileName+"-"+sh) && strings.Contains(strings.Join(onVictim, " "), profileName+"-"+sh) {
			t.Errorf("Degraded did not name %s, which ran on %s: %s", profileName+"-"+sh, name, degraded)
		}
	}
	left, err := e.kc.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name, LabelSelector: fleetSelector})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) > 0 {
		t.Errorf("fleet pods still bound to the dead node: %d", len(left.Items))
	}
	ev := e.lostPodEvents(t)
	t.Logf("the operator's events:\n%s", ev)
	for _, pod := range onVictim {
		if !strings.Contains(ev, pod) {
			t.Errorf("no LostPodDeleted event names %s, which was on %s", pod, name)
		}
	}
	where, err := e.placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("placement on the remaining nodes:\n%s", where)
	downReads := run.reads.Results().Since(before)
	t.Logf("reads while %s was down: %s", name, downReads)
	e.checkLostNodeReads(t, downReads, onVictim)

	before = run.reads.Results()
	back := time.Now()
	if err := e.c.StartNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	e.waitProfile(t, "settled with "+name+" back", 3*time.Minute, settledEverywhere)
	t.Logf("%s Ready and the profile settled %s after it was started again", name, time.Since(back).Round(100*time.Millisecond))
	after, err := e.podStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for pod, st := range states {
		if now, ok := after[pod]; !ok || now != st {
			t.Errorf("healthy pod %s was replaced or restarted when %s came back: %+v → %+v (present %v)", pod, name, st, now, ok)
		}
	}
	if where, err = e.placement(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("placement with %s back:\n%s", name, where)
	t.Logf("reads while %s came back: %s", name, run.reads.Results().Since(before))
}

// lostPodEvents lists the profile's LostPodDeleted events.
func (e *env) lostPodEvents(t *testing.T) string {
	evs, err := e.kc.EventsV1().Events(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.Regarding.Kind == "CacheProfile" && ev.Regarding.Name == profileName && ev.Reason == "LostPodDeleted" {
			related := ""
			if ev.Related != nil {
				related = ev.Related.Name + ": "
			}
			out = append(out, "  "+related+ev.Note)
		}
	}
	return strings.Join(out, "\n")
}

// leadersNodeDies: the node of the leading manager dies; the other
// replica leads within 30 s and reconciles a spec change made meanwhile.
func (e *env) leadersNodeDies(t *testing.T, run *running) {
	ctx := context.Background()
	leader, err := e.in.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name := leader.Spec.NodeName
	pods, err := e.fleetPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var onVictim []string
	for _, p := range pods {
		if p.Spec.NodeName == name {
			onVictim = append(onVictim, p.Name)
		}
	}
	t.Logf("%s, the leader, runs on %s with %v", leader.Name, name, onVictim)
	before := run.reads.Results()
	start := time.Now()
	if err := e.c.StopNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	// The change: the APIService's group priority, which only a
	// reconcile carries to the APIService.
	p, err := e.in.Profile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := p.Spec.Expose.APIService.GroupPriorityMinimum + 100
	body, _ := json.Marshal(map[string]any{"spec": map[string]any{"expose": map[string]any{"apiService": map[string]any{"groupPriorityMinimum": want}}}})
	if _, err := e.in.Dynamic().Resource(nodeinstall.ProfilesGVR).Patch(ctx, profileName, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var newLeader string
	for newLeader == "" {
		if l, err := e.in.Leader(ctx); err == nil && l.Name != leader.Name {
			newLeader = l.Name
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no other manager took the lease within 30 s of %s's node %s dying", leader.Name, name)
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	ac, err := apiregclient.NewForConfig(e.in.Admin)
	if err != nil {
		t.Fatal(err)
	}
	e.waitProfile(t, "the change reconciled by the new leader", 2*time.Minute, func(p *cachev1alpha1.CacheProfile) (string, bool) {
		a, err := ac.ApiregistrationV1().APIServices().Get(ctx, p.Status.APIServiceName, metav1.GetOptions{})
		if err != nil {
			return err.Error(), false
		}
		return fmt.Sprintf("observedGeneration %d of %d, APIService groupPriorityMinimum %d", p.Status.ObservedGeneration, p.Generation, a.Spec.GroupPriorityMinimum),
			p.Status.ObservedGeneration == p.Generation && a.Spec.GroupPriorityMinimum == want
	})
	t.Logf("leader %s lost with %s: %s leads %s later; the change made meanwhile reconciled %s after the node died",
		leader.Name, name, newLeader, took.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))
	if err := e.c.StartNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	e.waitProfile(t, "settled with "+name+" back", 5*time.Minute, settledEverywhere)
	if _, err := e.placement(ctx); err != nil {
		t.Fatal(err)
	}
	reads := run.reads.Results().Since(before)
	t.Logf("reads from the leader's node dying to the fleet settled with it back: %s", reads)
	e.checkLostNodeReads(t, reads, onVictim)
}

// checkLostNodeReads: while a node is lost, the tier answers every read
// (client-go retrying its 504s and 503s, which carry Retry-After). What
// may fail is outside it: a read the aggregator sends to a front on the
// dead node — its HTTP/2 connection there, or a new one kube-proxy routes
// to the dead pod (a front's GOAWAY makes the aggregator reconnect) — until
// the node lifecycle controller marks the pod NotReady (~50 s) and the
// Service drops it. The aggregator answers those with a bare 503, without
// Retry-After, which client-go does not retry; and a response the lost
// front had begun stays silent until the node is back, whose kernel then
// resets the connection, and the aggregator cuts the response it relays
// (an HTTP/2 stream reset, INTERNAL_ERROR, that client-go reports while
// reading the body). Only a lost front excuses them; every other failed
// read fails the test.
func (e *env) checkLostNodeReads(t *testing.T, reads clients.ReadResults, onVictim []string) {
	t.Helper()
	frontLost := false
	for _, p := range onVictim {
		frontLost = frontLost || strings.HasPrefix(p, profileName+"-front-")
	}
	var aggregator []string
	for _, f := range reads.Failures {
		if frontLost && (strings.HasPrefix(f.Err, aggregatorUnavailable) || strings.Contains(f.Err, aggregatorCutResponse)) {
			aggregator = append(aggregator, f.At.Format("15:04:05.000")+" "+f.Err)
			continue
		}
		t.Errorf("a read failed at %s: %s", f.At.Format("15:04:05.000"), f.Err)
	}
	if len(aggregator) == 0 {
		return
	}
	t.Logf("%d reads failed at the aggregator, which reached the lost front:\n  %s", len(aggregator), strings.Join(aggregator, "\n  "))
	var proxied []string
	for _, line := range strings.Split(controlplane.LogTail(e.c.LogPath("kube-apiserver"), 3000), "\n") {
		if strings.Contains(line, "error trying to reach service") || strings.Contains(line, "FailedDiscoveryCheck") ||
			(strings.Contains(line, "available_controller") && strings.Contains(line, "fleet")) {
			proxied = append(proxied, line)
		}
	}
	if len(proxied) > 8 {
		proxied = proxied[len(proxied)-8:]
	}
	if len(proxied) > 0 {
		t.Logf("the aggregator's last proxy errors:\n%s", strings.Join(proxied, "\n"))
	}
}

// aggregatorUnavailable is how client-go words a 503 without a Status body
// — the aggregator's own answer when it cannot reach an APIService's
// Service (the tier's 503s are Statuses naming the shard).
const aggregatorUnavailable = "the server is currently unable to handle the request"

// aggregatorCutResponse is how client-go words the aggregator's reset of a
// response whose backend connection failed mid-way (its proxy aborts the
// handler; Go's HTTP/2 server resets the stream).
const aggregatorCutResponse = "INTERNAL_ERROR; received from peer"

// informersEqual: the writer stops; the informers that read through the
// tier all along hold exactly the apiserver's objects, key by key and RV
// by RV; the reads are counted.
func (e *env) informersEqual(t *testing.T, run *running) {
	defer func() {
		if t.Failed() {
			// What the fronts the informers watch through did: a front
			// whose watches deliver nothing says why only in its log.
			t.Logf("fronts' logs:\n%s", e.in.PodLogs(context.Background(), fleetSelector+","+controllers.LabelComponent+"="+controllers.ComponentFront, 60))
		}
	}()
	run.writer.Halt()
	if w := run.writer.Writes.Load(); w == 0 || run.writer.Errs.Load() > w/10 {
		t.Errorf("writer: %d writes, %d errors", w, run.writer.Errs.Load())
	}
	run.informers.WaitSame(t, e.kc, cachedNamespaces, clients.Converge)
	res := run.reads.Stop()
	run.informers.Stop()
	run.stopped = true
	t.Logf("informers equal to the apiserver after %d writes; consistent reads through the tier over the whole run: %s", run.writer.Writes.Load(), res)
	if len(res.FirstAttempts) > 0 {
		t.Logf("first attempts that failed, by what they got:\n%s", clients.SortedCounts(res.FirstAttempts))
	}
	if res.OK == 0 {
		t.Fatal("no read was answered")
	}
	if n := res.FailedReads(); n > 0 {
		// Each was judged in its step (drains: none may fail; a lost
		// node: only at the aggregator, reaching a lost front).
		t.Logf("%d reads failed after client-go's retries:\n%s", n, clients.SortedCounts(res.Failed))
	}
}

package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
)

const profileName = "fleet"

func newProfile() *cachev1alpha1.CacheProfile {
	return &cachev1alpha1.CacheProfile{
		ObjectMeta: metav1.ObjectMeta{Name: profileName},
		Spec: cachev1alpha1.CacheProfileSpec{
			Resources: []cachev1alpha1.CachedResource{
				{Version: "v1", Resource: "pods", FieldIndexes: []string{"spec.nodeName"}},
				{Version: "v1", Resource: "configmaps", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"cache": "yes"}}},
			},
			HashShards: 4,
			Shards:     2,
			Expose:     cachev1alpha1.Expose{Service: cachev1alpha1.ServiceExpose{ClusterIP: frontClusterIP, Port: frontPort}},
		},
	}
}

func key(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

func (h *harness) profile(t *testing.T) *cachev1alpha1.CacheProfile {
	t.Helper()
	var p cachev1alpha1.CacheProfile
	if err := h.client.Get(context.Background(), key("", profileName), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// conditionsAre checks type=status/reason triples on the profile's latest
// status, for the current generation.
func (h *harness) conditionsAre(want map[string]string) error {
	var p cachev1alpha1.CacheProfile
	if err := h.client.Get(context.Background(), key("", profileName), &p); err != nil {
		return err
	}
	if p.Status.ObservedGeneration != p.Generation {
		return fmt.Errorf("observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
	}
	var diffs []string
	for typ, sr := range want {
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		got := "<none>"
		if c != nil {
			got = string(c.Status) + "/" + c.Reason
		}
		if got != sr {
			msg := ""
			if c != nil {
				msg = " (" + c.Message + ")"
			}
			diffs = append(diffs, fmt.Sprintf("%s is %s, want %s%s", typ, got, sr, msg))
		}
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// markStatefulSet simulates the StatefulSet controller (absent in envtest).
func (h *harness) markStatefulSet(t *testing.T, name string, ready int32) {
	t.Helper()
	eventually(t, 10*time.Second, "status of "+name, func() error {
		var s appsv1.StatefulSet
		if err := h.client.Get(context.Background(), key(workloadNamespace, name), &s); err != nil {
			return err
		}
		n := *s.Spec.Replicas
		s.Status = appsv1.StatefulSetStatus{ObservedGeneration: s.Generation, Replicas: n, ReadyReplicas: ready, AvailableReplicas: ready,
			CurrentReplicas: n, UpdatedReplicas: n, CurrentRevision: "rev", UpdateRevision: "rev"}
		return h.client.Status().Update(context.Background(), &s)
	})
}

func (h *harness) markFront(t *testing.T, available int32) {
	t.Helper()
	h.markFrontTerminating(t, available, 0)
}

// markFrontTerminating also reports pods of the previous template that are
// still terminating, as the deployment controller does since 1.35.
func (h *harness) markFrontTerminating(t *testing.T, available, terminating int32) {
	t.Helper()
	eventually(t, 10*time.Second, "front status", func() error {
		var d appsv1.Deployment
		if err := h.client.Get(context.Background(), key(workloadNamespace, profileName+"-front"), &d); err != nil {
			return err
		}
		n := *d.Spec.Replicas
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: available, AvailableReplicas: available,
			TerminatingReplicas: ptr.To(terminating)}
		return h.client.Status().Update(context.Background(), &d)
	})
}

// fakeFront stands in for the front's pods: it serves discovery for the
// profile's group with the serving certificate the operator issued, on the
// front Service's ClusterIP, which is where the aggregator dials.
func (h *harness) startFakeFront(t *testing.T) {
	t.Helper()
	var sec corev1.Secret
	if err := h.client.Get(context.Background(), key(workloadNamespace, profileName+"-serving-cert"), &sec); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	group := profileName + "." + cachev1alpha1.APIGroupSuffix
	mux := http.NewServeMux()
	mux.HandleFunc("/apis/"+group+"/v1alpha1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(metav1.APIResourceList{
			TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: group + "/v1alpha1",
			APIResources: []metav1.APIResource{},
		})
	})
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", frontClusterIP, frontPort))
	if err != nil {
		t.Fatalf("listening on the front ClusterIP: %v", err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	h.front = srv
	// Stopped when the whole test ends, not when the subtest that started
	// it does.
	h.t.Cleanup(func() { _ = srv.Close() })
}

// createEndpointSlice: the aggregator only checks a Service that has a
// ready endpoint; the address is a documentation address never dialed
// (the aggregator dials the ClusterIP).
func (h *harness) createEndpointSlice(t *testing.T) {
	t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: profileName + "-front-test", Namespace: workloadNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: profileName + "-front"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](8443), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := h.client.Create(context.Background(), es); err != nil {
		t.Fatal(err)
	}
}

func TestCacheProfileLifecycle(t *testing.T) {
	h := startHarness(t)
	ctx := context.Background()
	c := h.client

	t.Run("invalid profiles are rejected", func(t *testing.T) { testInvalidProfilesRejected(t, h) })

	if err := c.Create(ctx, newProfile()); err != nil {
		t.Fatal(err)
	}

	// Every child appears with its shape.
	var shards [2]appsv1.StatefulSet
	// Every child exists (the front Service may need a retry: right after
	// the apiserver starts, ClusterIP allocation waits for its ServiceCIDR).
	eventually(t, 30*time.Second, "children created", func() error {
		for i := range shards {
			if err := c.Get(ctx, key(workloadNamespace, fmt.Sprintf("fleet-shard-%d", i)), &shards[i]); err != nil {
				return err
			}
		}
		for _, o := range []struct {
			ns, name string
			obj      client.Object
		}{
			{workloadNamespace, "fleet-front", &corev1.Service{}},
			{workloadNamespace, "fleet-shards", &corev1.Service{}},
			{workloadNamespace, "fleet-front", &appsv1.Deployment{}},
			{workloadNamespace, "fleet-front", &policyv1.PodDisruptionBudget{}},
			{"", "v1alpha1.fleet.cache.cachetier.io", &apiregv1.APIService{}},
		} {
			if err := c.Get(ctx, key(o.ns, o.name), o.obj); err != nil {
				return err
			}
		}
		return nil
	})
	assertChildren(t, h, shards)
	eventually(t, 10*time.Second, "progressing after creation", func() error {
		return h.conditionsAre(map[string]string{"Progressing": "True/RollingOut", "Available": "False/ShardsUnavailable", "Degraded": "False/AsExpected"})
	})

	t.Run("becomes available", func(t *testing.T) {
		h.startFakeFront(t)
		h.createEndpointSlice(t)
		h.markStatefulSet(t, "fleet-shard-0", 2)
		h.markStatefulSet(t, "fleet-shard-1", 2)
		h.markFront(t, 2)
		eventually(t, 60*time.Second, "available", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Progressing": "False/RolloutComplete", "Degraded": "False/AsExpected"})
		})
		p := h.profile(t)
		if p.Status.Front != "2/2" {
			t.Errorf("status.front %q, want 2/2", p.Status.Front)
		}
		if p.Status.Ready != "2/2" || p.Status.ReadyShards != 2 || len(p.Status.Shards) != 2 || p.Status.Shards[1].HashShards != "2-3" ||
			p.Status.Shards[1].ReadyReplicas != 2 || p.Status.FrontReadyReplicas != 2 ||
			p.Status.APIServiceName != "v1alpha1.fleet.cache.cachetier.io" || p.Status.ServerURL != strings.TrimSuffix(h.cfg.Host, "/")+"/apis/fleet.cache.cachetier.io/v1alpha1/watch" {
			t.Errorf("status: %+v", p.Status)
		}
		// The real aggregator proxies to the front over TLS verified with the
		// operator's CA: the whole registration works.
		cs := kubernetes.NewForConfigOrDie(h.cfg)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/apis/fleet.cache.cachetier.io/v1alpha1").DoRaw(ctx)
		if err != nil || !strings.Contains(string(body), `"groupVersion":"fleet.cache.cachetier.io/v1alpha1"`) {
			t.Errorf("discovery through the aggregator: %v %s", err, body)
		}
		h.metricsAre(t, map[string]float64{
			`cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-0"}`: 2,
			`cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-1"}`: 2,
			`cachetier_profile_condition{profile="fleet",type="Available"}`:                 1,
			`cachetier_profile_condition{profile="fleet",type="Degraded"}`:                  0,
		})
		testKubectlGetHealthy(t, h)
		testOperatorMetricsLint(t, h)
	})

	t.Run("unchanged profile is not written", func(t *testing.T) {
		waitQuiet(t, h)
		before := h.writes.Load()
		statusBefore := h.profile(t).Status
		for range 3 {
			res, err := h.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key("", profileName)})
			if err != nil || res.RequeueAfter <= 0 {
				t.Fatalf("reconcile: %+v %v", res, err)
			}
		}
		// A metadata-only change of the profile triggers the manager's own
		// reconcile too.
		// (A merge patch: an Update would re-serialize historyWindow "150s"
		// as "2m30s", a real spec change.)
		p := h.profile(t)
		patch := client.MergeFrom(p.DeepCopy())
		p.Annotations = map[string]string{"touched": "yes"}
		if err := c.Patch(ctx, p, patch); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if after := h.writes.Load(); after != before {
			t.Fatalf("%d writes while reconciling an unchanged profile, last: %v\nstatus before: %+v\nstatus after:  %+v",
				after-before, h.lastWrite.Load(), statusBefore, h.profile(t).Status)
		}
	})

	t.Run("shard unready is degraded and recovers", func(t *testing.T) {
		h.markStatefulSet(t, "fleet-shard-1", 0)
		eventually(t, 20*time.Second, "degraded", func() error {
			return h.conditionsAre(map[string]string{"Available": "False/ShardsUnavailable", "Degraded": "True/ShardUnready"})
		})
		if d := meta.FindStatusCondition(h.profile(t).Status.Conditions, "Degraded"); !strings.Contains(d.Message, "fleet-shard-1 (0/2 ready)") {
			t.Errorf("degraded message does not name the shard: %q", d.Message)
		}
		eventually(t, 10*time.Second, "warning event", func() error { return hasEvent(h, "DegradedTrue", "Warning") })
		h.metricsAre(t, map[string]float64{
			`cachetier_profile_shard_ready_replicas{profile="fleet",shard="fleet-shard-1"}`: 0,
			`cachetier_profile_condition{profile="fleet",type="Available"}`:                 0,
			`cachetier_profile_condition{profile="fleet",type="Degraded"}`:                  1,
		})
		testKubectlDegraded(t, h)
		h.markStatefulSet(t, "fleet-shard-1", 2)
		eventually(t, 20*time.Second, "recovered", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Degraded": "False/AsExpected"})
		})
	})

	t.Run("lost node", func(t *testing.T) { testLostNode(t, h) })

	t.Run("apiservice deleted is recreated; unreachable front is degraded", func(t *testing.T) {
		var a apiregv1.APIService
		if err := c.Get(ctx, key("", "v1alpha1.fleet.cache.cachetier.io"), &a); err != nil {
			t.Fatal(err)
		}
		oldUID := a.UID
		// Stop the fake front first: the recreated APIService then fails the
		// aggregator's discovery check.
		h.frontStopped(t)
		if err := c.Delete(ctx, &a); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "apiservice recreated", func() error {
			var n apiregv1.APIService
			if err := c.Get(ctx, key("", a.Name), &n); err != nil {
				return err
			}
			if n.UID == oldUID {
				return errors.New("not yet deleted")
			}
			return nil
		})
		eventually(t, 40*time.Second, "degraded by the apiservice", func() error {
			return h.conditionsAre(map[string]string{"Available": "False/APIServiceUnavailable", "Degraded": "True/APIServiceUnavailable"})
		})
		h.startFakeFront(t)
		eventually(t, 90*time.Second, "recovered", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Degraded": "False/AsExpected"})
		})
	})

	t.Run("spec changes roll out", func(t *testing.T) {
		update(t, h, func(p *cachev1alpha1.CacheProfile) {
			p.Spec.ReplicasPerShard = 3
			p.Spec.Scheduling.NodeSelector = map[string]string{"pool": "cache"}
		})
		eventually(t, 20*time.Second, "shards updated", func() error {
			for i := range 2 {
				var s appsv1.StatefulSet
				if err := c.Get(ctx, key(workloadNamespace, fmt.Sprintf("fleet-shard-%d", i)), &s); err != nil {
					return err
				}
				if *s.Spec.Replicas != 3 || s.Spec.Template.Spec.NodeSelector["pool"] != "cache" {
					return fmt.Errorf("%s: replicas %d nodeSelector %v", s.Name, *s.Spec.Replicas, s.Spec.Template.Spec.NodeSelector)
				}
			}
			return h.conditionsAre(map[string]string{"Progressing": "True/RollingOut"})
		})
		// A field the operator stops setting is removed from the child.
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Spec.Scheduling.NodeSelector = nil })
		eventually(t, 20*time.Second, "nodeSelector removed", func() error {
			var s appsv1.StatefulSet
			if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &s); err != nil {
				return err
			}
			if len(s.Spec.Template.Spec.NodeSelector) != 0 {
				return fmt.Errorf("nodeSelector %v", s.Spec.Template.Spec.NodeSelector)
			}
			return nil
		})
		h.markStatefulSet(t, "fleet-shard-0", 3)
		h.markStatefulSet(t, "fleet-shard-1", 3)
		h.markFront(t, 2)
		eventually(t, 20*time.Second, "rolled out", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Progressing": "False/RolloutComplete", "Degraded": "False/AsExpected"})
		})
		// Drift of an owned field is repaired.
		var s appsv1.StatefulSet
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &s); err != nil {
			t.Fatal(err)
		}
		s.Spec.Replicas = ptr.To[int32](1)
		if err := c.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "drift repaired", func() error {
			if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &s); err != nil {
				return err
			}
			if *s.Spec.Replicas != 3 {
				return fmt.Errorf("replicas %d", *s.Spec.Replicas)
			}
			return nil
		})
		h.markStatefulSet(t, "fleet-shard-0", 3)
	})

	t.Run("shard count change", func(t *testing.T) {
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Spec.Shards = 3 })
		eventually(t, 20*time.Second, "third shard", func() error {
			var s appsv1.StatefulSet
			if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &s); err != nil {
				return err
			}
			if !slices.Contains(s.Spec.Template.Spec.Containers[0].Args, "--hash-shards=3-3") {
				return fmt.Errorf("args %v", s.Spec.Template.Spec.Containers[0].Args)
			}
			return c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &policyv1.PodDisruptionBudget{})
		})
		for i := range 3 {
			h.markStatefulSet(t, fmt.Sprintf("fleet-shard-%d", i), 3)
		}
		h.markFront(t, 2)
		eventually(t, 20*time.Second, "three shards available", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Progressing": "False/RolloutComplete"})
		})

		// Shrinking keeps the surplus shard until the others serve its hash
		// shards with every replica ready.
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Spec.Shards = 2 })
		eventually(t, 20*time.Second, "shrink pending", func() error {
			return h.conditionsAre(map[string]string{"Progressing": "True/ShardCountChanging"})
		})
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &appsv1.StatefulSet{}); err != nil {
			t.Fatalf("surplus shard removed before the others were ready: %v", err)
		}
		h.markStatefulSet(t, "fleet-shard-0", 3)
		h.markStatefulSet(t, "fleet-shard-1", 3)
		// The fronts still run the 3-shard topology: they read shard 2
		// until they are replaced, so it must stay.
		time.Sleep(2 * time.Second)
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &appsv1.StatefulSet{}); err != nil {
			t.Fatalf("surplus shard removed while the fronts still read it: %v", err)
		}
		if err := h.conditionsAre(map[string]string{"Progressing": "True/ShardCountChanging"}); err != nil {
			t.Fatal(err)
		}
		// Rolled out, but a replaced front pod still serves the 3-shard
		// topology through its preStop sleep and shutdown.
		h.markFrontTerminating(t, 2, 1)
		time.Sleep(2 * time.Second)
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &appsv1.StatefulSet{}); err != nil {
			t.Fatalf("surplus shard removed while a replaced front still terminated: %v", err)
		}
		h.markFront(t, 2) // the replaced fronts are gone
		eventually(t, 20*time.Second, "surplus shard removed", func() error {
			err := c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &appsv1.StatefulSet{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("shard 2 still there: %v", err)
			}
			err = c.Get(ctx, key(workloadNamespace, "fleet-shard-2"), &policyv1.PodDisruptionBudget{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("PDB of shard 2 still there: %v", err)
			}
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Progressing": "False/RolloutComplete"})
		})
	})

	t.Run("apiservice registration can be turned off and on", func(t *testing.T) {
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Spec.Expose.APIService.Enabled = ptr.To(false) })
		eventually(t, 20*time.Second, "apiservice removed", func() error {
			err := c.Get(ctx, key("", "v1alpha1.fleet.cache.cachetier.io"), &apiregv1.APIService{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("APIService still there: %v", err)
			}
			if p := h.profile(t); p.Status.APIServiceName != "" {
				return fmt.Errorf("status.apiServiceName %q", p.Status.APIServiceName)
			}
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Degraded": "False/AsExpected"})
		})
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Spec.Expose.APIService.Enabled = ptr.To(true) })
		eventually(t, 60*time.Second, "apiservice back and available", func() error {
			return h.conditionsAre(map[string]string{"Available": "True/Available", "Degraded": "False/AsExpected"})
		})
	})

	t.Run("serving certificate rotation", func(t *testing.T) {
		var before corev1.Secret
		if err := c.Get(ctx, key(workloadNamespace, "fleet-serving-cert"), &before); err != nil {
			t.Fatal(err)
		}
		var shardBefore appsv1.StatefulSet
		var frontBefore appsv1.Deployment
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &shardBefore); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, key(workloadNamespace, "fleet-front"), &frontBefore); err != nil {
			t.Fatal(err)
		}
		h.clockSkew.Store(int64(70 * 24 * time.Hour)) // inside the renewal window
		update(t, h, func(p *cachev1alpha1.CacheProfile) { p.Annotations["rotate"] = "now" })
		eventually(t, 20*time.Second, "rotated", func() error {
			var s corev1.Secret
			if err := c.Get(ctx, key(workloadNamespace, "fleet-serving-cert"), &s); err != nil {
				return err
			}
			if string(s.Data["tls.crt"]) == string(before.Data["tls.crt"]) {
				return errors.New("serving certificate unchanged")
			}
			if err := verifiesFor(s.Data, h.reconciler.Now(), "fleet-shard-1-2.fleet-shards.cachetier-system.svc", "fleet-front.cachetier-system.svc"); err != nil {
				return err
			}
			// The front rolls onto the new certificate.
			var f appsv1.Deployment
			if err := c.Get(ctx, key(workloadNamespace, "fleet-front"), &f); err != nil {
				return err
			}
			if f.Spec.Template.Annotations[controllers.AnnotationCertHash] == frontBefore.Spec.Template.Annotations[controllers.AnnotationCertHash] {
				return errors.New("front pod template still has the old certificate hash")
			}
			return hasEvent(h, "ServingCertificateRotated", "Normal")
		})
		h.clockSkew.Store(0)
		// Shards pick the new certificate up from the mounted Secret; their
		// pods are not restarted (that would drop their caches).
		var shardAfter appsv1.StatefulSet
		if err := c.Get(ctx, key(workloadNamespace, "fleet-shard-0"), &shardAfter); err != nil {
			t.Fatal(err)
		}
		if shardAfter.Generation != shardBefore.Generation || !equality.Semantic.DeepEqual(shardAfter.Spec.Template, shardBefore.Spec.Template) {
			t.Errorf("shard StatefulSet changed on certificate rotation: generation %d -> %d", shardBefore.Generation, shardAfter.Generation)
		}
	})

	t.Run("prometheusrule follows the prometheus operator CRD", func(t *testing.T) { testPrometheusRule(t, h) })

	t.Run("servicemonitor follows the prometheus operator CRD", func(t *testing.T) {
		installServiceMonitorCRD(t, h)
		eventually(t, 30*time.Second, "servicemonitor", func() error {
			sm := &unstructured.Unstructured{}
			sm.SetAPIVersion("monitoring.coreos.com/v1")
			sm.SetKind("ServiceMonitor")
			if err := c.Get(ctx, key(workloadNamespace, profileName), sm); err != nil {
				return err
			}
			port, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			if len(port) != 1 {
				return fmt.Errorf("endpoints %v", port)
			}
			return nil
		})
	})

	t.Run("deletion removes every child", func(t *testing.T) {
		if err := c.Delete(ctx, h.profile(t)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "profile gone", func() error {
			err := c.Get(ctx, key("", profileName), &cachev1alpha1.CacheProfile{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("profile still there: %v", err)
			}
			return nil
		})
		sel := client.MatchingLabels{controllers.LabelProfile: profileName}
		for _, l := range []client.ObjectList{
			&appsv1.StatefulSetList{}, &appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
			&corev1.ConfigMapList{}, &corev1.SecretList{}, &policyv1.PodDisruptionBudgetList{},
			&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}, &rbacv1.RoleBindingList{}, &apiregv1.APIServiceList{},
		} {
			if err := c.List(ctx, l, sel); err != nil {
				t.Fatal(err)
			}
			if n := meta.LenList(l); n != 0 {
				t.Errorf("%T: %d children left", l, n)
			}
		}
		sms := &unstructured.UnstructuredList{}
		sms.SetAPIVersion("monitoring.coreos.com/v1")
		sms.SetKind("ServiceMonitorList")
		if err := c.List(ctx, sms, client.InNamespace(workloadNamespace)); err != nil || len(sms.Items) != 0 {
			t.Errorf("servicemonitors left: %v %d", err, len(sms.Items))
		}
		prs := &unstructured.UnstructuredList{}
		prs.SetAPIVersion("monitoring.coreos.com/v1")
		prs.SetKind("PrometheusRuleList")
		if err := c.List(ctx, prs, client.InNamespace(workloadNamespace)); err != nil || len(prs.Items) != 0 {
			t.Errorf("prometheusrules left: %v %d", err, len(prs.Items))
		}
		if n := testutil.CollectAndCount(h.metrics); n != 0 {
			t.Errorf("%d profile metric series left after deletion", n)
		}
	})
}

// frontStopped stops the current fake front and checks nothing listens on
// the front's address any more.
func (h *harness) frontStopped(t *testing.T) {
	t.Helper()
	_ = h.front.Close()
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", frontClusterIP, frontPort), time.Second); err == nil {
		_ = conn.Close()
		t.Fatal("fake front still listening")
	}
}

func update(t *testing.T, h *harness, mut func(*cachev1alpha1.CacheProfile)) {
	t.Helper()
	eventually(t, 10*time.Second, "update profile", func() error {
		p := h.profile(t)
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		mut(p)
		return h.client.Update(context.Background(), p)
	})
}

// waitQuiet waits until the manager has stopped writing (the aggregator and
// the test's own status updates trigger reconciles that settle the status).
func waitQuiet(t *testing.T, h *harness) {
	t.Helper()
	last, since := h.writes.Load(), time.Now()
	for time.Since(since) < 2*time.Second {
		time.Sleep(200 * time.Millisecond)
		if n := h.writes.Load(); n != last {
			last, since = n, time.Now()
		}
	}
}

func hasEvent(h *harness, reason, typ string) error {
	var evs eventsv1.EventList
	if err := h.client.List(context.Background(), &evs); err != nil {
		return err
	}
	for _, e := range evs.Items {
		if e.Regarding.Kind == "CacheProfile" && e.Regarding.Name == profileName && e.Reason == reason && e.Type == typ {
			return nil
		}
	}
	return fmt.Errorf("no %s event %s among %d", typ, reason, len(evs.Items))
}

func installServiceMonitorCRD(t *testing.T, h *harness) {
	t.Helper()
	installMonitoringCRD(t, h, apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"})
}

// installMonitoringCRD installs a Prometheus Operator kind with a schema
// that keeps every field (the operator's own CRDs validate more; what the
// operator writes is checked by the tests that read it back).
func installMonitoringCRD(t *testing.T, h *harness, names apiextensionsv1.CustomResourceDefinitionNames) {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: names.Plural + ".monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: names,
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
	if err := h.client.Create(context.Background(), crd); err != nil {
		t.Fatal(err)
	}
}

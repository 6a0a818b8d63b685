package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// maxRequeue bounds the time between two reconciles of a healthy profile so
// that certificate renewal windows are never missed by much even if the
// manager was down when a timer would have fired.
const maxRequeue = 6 * time.Hour

// CacheProfileReconciler turns CacheProfiles into cache-server fleets.
type CacheProfileReconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	Options  Options
	// Metrics, when set, exports every profile's shard readiness and
	// conditions.
	Metrics *ProfileMetrics
	// Now and Rand are injected so that tests control certificate timing.
	Now  func() time.Time
	Rand io.Reader
}

// Cluster-scoped permissions only; what the operator does in its own
// namespace is granted by config/rbac/workload_role.yaml (a Role, so the
// operator cannot touch Secrets or workloads elsewhere).
// +kubebuilder:rbac:groups=cachetier.io,resources=cacheprofiles,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cachetier.io,resources=cacheprofiles/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cachetier.io,resources=cacheprofiles/finalizers,verbs=update
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles;clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// The fleet's ClusterRole grants reads the operator itself does not have.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=escalate;bind
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;list;watch;create;update;patch;delete,namespace=kube-system
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles,verbs=bind,resourceNames=extension-apiserver-authentication-reader,namespace=kube-system
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch
// Nodes: which of them the fleet's pods are bound to have been lost (nodeloss.go).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// Events about cluster-scoped profiles are recorded in the default namespace.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// ManagedSelector selects every object the operator creates; the manager's
// cache is restricted to it so that the operator neither holds every
// StatefulSet or Secret of the cluster in memory nor needs to read them.
func ManagedSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue})
}

// CacheOptions restricts the manager's cache for the child kinds to the
// objects it manages, and namespaced kinds to the namespaces it writes to
// (the workload namespace, kube-system for the auth-reader RoleBinding). The
// RBAC in config/rbac grants exactly these namespaces. The fleets' pods are
// cached (their labels carry the managed-by label too) and every Node,
// without its image list, which is most of a Node's size.
func CacheOptions(workloadNamespace string) cache.Options {
	sel := ManagedSelector()
	cluster := cache.ByObject{Label: sel}
	ns := cache.ByObject{Label: sel, Namespaces: map[string]cache.Config{workloadNamespace: {}}}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.StatefulSet{}:           ns,
		&appsv1.Deployment{}:            ns,
		&corev1.Service{}:               ns,
		&corev1.ServiceAccount{}:        ns,
		&corev1.ConfigMap{}:             ns,
		&corev1.Secret{}:                ns,
		&policyv1.PodDisruptionBudget{}: ns,
		&rbacv1.RoleBinding{}:           {Label: sel, Namespaces: map[string]cache.Config{AuthReaderNamespace: {}, workloadNamespace: {}}},
		&rbacv1.Role{}:                  ns,
		&rbacv1.ClusterRole{}:           cluster,
		&rbacv1.ClusterRoleBinding{}:    cluster,
		&apiregv1.APIService{}:          cluster,
		&corev1.Pod{}:                   ns,
		&corev1.Node{}:                  {Transform: slimNode},
	}}
}

// slimNode keeps what nodeState reads (taints, conditions) and the
// metadata; images, addresses and the rest of the status go.
func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.Status = corev1.NodeStatus{Conditions: n.Status.Conditions}
	return n, nil
}

// AddToScheme registers every type the reconciler reads or writes.
func AddToScheme(s *runtime.Scheme) error {
	return errors.Join(cachev1alpha1.AddToScheme(s), apiregv1.AddToScheme(s), apiextensionsv1.AddToScheme(s))
}

// SetupWithManager registers the controller.
func (r *CacheProfileReconciler) SetupWithManager(mgr ctrl.Manager) error {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	return ctrl.NewControllerManagedBy(mgr).
		For(&cachev1alpha1.CacheProfile{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Secret{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&rbacv1.ClusterRole{}).
		Owns(&rbacv1.ClusterRoleBinding{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&rbacv1.Role{}).
		Owns(&apiregv1.APIService{}).
		// The ServiceMonitor and PrometheusRule appear or go with the
		// Prometheus Operator's CRDs: re-evaluate every profile when one
		// changes.
		WatchesMetadata(crd, handler.EnqueueRequestsFromMapFunc(r.allProfiles),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool { return isMonitoringCRD(o.GetName()) }))).
		// A fleet pod placed on a node or evicted by Kubernetes
		// (nodeloss.go): its profile.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(profileOfPod), builder.WithPredicates(podPlacedOrTerminating)).
		// A node lost or back: every profile (nodes change rarely; a
		// profile whose pods are elsewhere reconciles to no change).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allProfiles), builder.WithPredicates(nodeHealthChanged)).
		Complete(r)
}

func profileOfPod(_ context.Context, o client.Object) []reconcile.Request {
	if name := o.GetLabels()[LabelProfile]; name != "" {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
	}
	return nil
}

// podPlacedOrTerminating passes a fleet pod that appeared, was bound to a
// node, turned terminating or went — what can put a pod on a lost node,
// make it one to delete, or take it off — not its status updates.
var podPlacedOrTerminating = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return true },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		return o.Spec.NodeName != n.Spec.NodeName || (o.DeletionTimestamp == nil && n.DeletionTimestamp != nil)
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// nodeHealthChanged passes a node that appeared or went, whose Ready
// condition changed status, or whose taints changed — not its heartbeats.
var nodeHealthChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok1 || !ok2 {
			return true
		}
		return readyStatus(o) != readyStatus(n) || !equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints)
	},
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

func (r *CacheProfileReconciler) allProfiles(ctx context.Context, _ client.Object) []reconcile.Request {
	var list cachev1alpha1.CacheProfileList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing profiles")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return out
}

// Reconcile brings one profile's children to their desired state and
// records what it observed in the status.
func (r *CacheProfileReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var p cachev1alpha1.CacheProfile
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone without our finalizer running here (removed by hand):
			// its series would otherwise go on feeding the alerts.
			r.Metrics.Forget(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &p)
	}
	if !slices.Contains(p.Finalizers, Finalizer) {
		patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
		p.Finalizers = append(p.Finalizers, Finalizer)
		if err := r.Client.Patch(ctx, &p, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	now := r.Now()

	if msg := ValidateSpec(&p); msg != "" {
		r.event(&p, corev1.EventTypeWarning, ReasonInvalidSpec, "Validate", msg)
		return ctrl.Result{}, r.writeStatus(ctx, &p, Observed{InvalidSpec: msg}, now)
	}

	certs, plan, tlsSecrets, err := r.certificates(ctx, &p, now)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("certificates: %w", err)
	}
	mon, err := r.monitoring(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	desired, err := BuildDesired(&p, r.Options, certs, mon)
	if err != nil {
		return ctrl.Result{}, err
	}

	var applyErrs []string
	for _, obj := range desired.Objects() {
		var changed bool
		var err error
		switch obj {
		case desired.CASecret:
			changed, err = r.applyAgainst(ctx, obj, tlsSecrets.ca)
		case desired.ServingSecret:
			changed, err = r.applyAgainst(ctx, obj, tlsSecrets.serving)
		default:
			changed, err = r.apply(ctx, obj)
		}
		if err != nil {
			logger.Error(err, "apply", "kind", obj.GetObjectKind().GroupVersionKind().Kind, "name", obj.GetName())
			applyErrs = append(applyErrs, fmt.Sprintf("%s %s: %v", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err))
			continue
		}
		if changed && obj == desired.CASecret && plan.NewCA {
			r.event(&p, corev1.EventTypeNormal, "CertificateAuthorityRotated", "Rotate", plan.Reason)
		} else if changed && obj == desired.ServingSecret && plan.NewServing {
			r.event(&p, corev1.EventTypeNormal, "ServingCertificateRotated", "Rotate", plan.Reason)
		}
	}
	if desired.APIService == nil {
		if err := r.deleteIfOurs(ctx, &apiregv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: APIServiceName(&p)}}); err != nil {
			applyErrs = append(applyErrs, "deleting APIService: "+err.Error())
		}
	}

	obs, err := r.observe(ctx, &p, desired)
	if err != nil {
		return ctrl.Result{}, err
	}
	if obs.NodeProblems, err = r.handleNodeLoss(ctx, &p); err != nil {
		return ctrl.Result{}, err
	}
	// drainWait > 0: only the time bound of frontDrained keeps the surplus
	// shards; no event will say when it has passed, so come back then.
	var drainWait time.Duration
	if len(obs.SurplusShards) > 0 {
		var settled bool
		settled, drainWait = shardsSettled(desired, obs, now)
		if !settled {
			logger.V(1).Info("keeping surplus shards until the fleet has settled", "shards", obs.SurplusShards, "drainWait", drainWait)
		} else {
			for _, name := range obs.SurplusShards {
				if err := r.deleteSurplusShard(ctx, name); err != nil {
					applyErrs = append(applyErrs, fmt.Sprintf("removing surplus shard %s: %v", name, err))
				}
			}
			r.event(&p, corev1.EventTypeNormal, "ShardsRemoved", "ScaleDown", fmt.Sprintf("removed %v: their hash shards are served by the remaining shards", obs.SurplusShards))
			obs.SurplusShards = nil
		}
	}
	if len(applyErrs) > 0 {
		obs.ApplyError = fmt.Sprint(applyErrs)
	}
	if err := r.writeStatus(ctx, &p, obs, now); err != nil {
		return ctrl.Result{}, err
	}
	if len(applyErrs) > 0 {
		// Retry with the controller's backoff; the status already says why.
		return ctrl.Result{}, errors.New(obs.ApplyError)
	}
	requeue := min(max(plan.NextRenewal.Sub(now), time.Second), maxRequeue)
	if drainWait > 0 {
		requeue = min(requeue, drainWait)
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// ValidateSpec catches what the CRD schema cannot (or what a profile stored
// before a rule existed may contain). It returns "" for a valid spec.
func ValidateSpec(in *cachev1alpha1.CacheProfile) string {
	p := WithDefaults(in)
	if p.Spec.Shards > p.Spec.HashShards {
		return fmt.Sprintf("shards (%d) must not exceed hashShards (%d)", p.Spec.Shards, p.Spec.HashShards)
	}
	if len(p.Spec.Resources) == 0 {
		return "resources must not be empty"
	}
	seen := map[schema.GroupResource]bool{}
	for i, r := range p.Spec.Resources {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		if seen[gr] {
			return fmt.Sprintf("resources[%d]: %s is listed more than once", i, gr)
		}
		seen[gr] = true
		for name, sel := range map[string]*metav1.LabelSelector{"namespaceSelector": r.NamespaceSelector, "labelSelector": r.LabelSelector} {
			if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
				return fmt.Sprintf("resources[%d].%s: %v", i, name, err)
			}
		}
	}
	return ""
}

func (r *CacheProfileReconciler) event(p *cachev1alpha1.CacheProfile, kind, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(p, nil, kind, reason, action, "%s", note)
	}
}

// observedSecrets are the TLS Secrets as certificates read them (nil: not
// found).
type observedSecrets struct{ ca, serving *unstructured.Unstructured }

// certificates reads the current TLS material and renews what is due. It
// returns the Secrets it read, for the apply of the desired ones to compare
// with: the cache can process a deletion between two reads of one
// reconcile, and an apply that found the Secret gone after certificates
// had found it would recreate it with the old certificate — a person who
// deleted the serving Secret to rotate it got the same one back (CI, under
// load). Against one snapshot, a deletion the first read missed is the
// next reconcile's (the Secret's delete event triggers it), which issues a
// new certificate.
func (r *CacheProfileReconciler) certificates(ctx context.Context, p *cachev1alpha1.CacheProfile, now time.Time) (Certificates, CertPlan, observedSecrets, error) {
	var data [2]map[string][]byte
	var seen [2]*unstructured.Unstructured
	for i, name := range []string{caSecretName(p), servingSecretName(p)} {
		u, err := r.observedFor(ctx, corev1.SchemeGroupVersion.WithKind("Secret"), types.NamespacedName{Namespace: r.Options.Namespace, Name: name})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return Certificates{}, CertPlan{}, observedSecrets{}, err
		}
		var sec corev1.Secret
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &sec); err != nil {
			return Certificates{}, CertPlan{}, observedSecrets{}, err
		}
		data[i], seen[i] = sec.Data, u
	}
	certs, plan, err := EnsureCertificates(r.Rand, now, certificatesFromSecrets(data[0], data[1]), ServingDNSNames(p, r.Options))
	return certs, plan, observedSecrets{ca: seen[0], serving: seen[1]}, err
}

// observedFor reads the current state of a child: typed kinds come from the
// cache, the ServiceMonitor and PrometheusRule (no Go types here) are read
// as unstructured.
func (r *CacheProfileReconciler) observedFor(ctx context.Context, gvk schema.GroupVersionKind, key types.NamespacedName) (*unstructured.Unstructured, error) {
	if r.Scheme.Recognizes(gvk) {
		o, err := r.Scheme.New(gvk)
		if err != nil {
			return nil, err
		}
		obj := o.(client.Object)
		if err := r.Client.Get(ctx, key, obj); err != nil {
			return nil, err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, err
		}
		return &unstructured.Unstructured{Object: m}, nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := r.Client.Get(ctx, key, u); err != nil {
		return nil, err
	}
	return u, nil
}

// apply writes obj with server-side apply unless the observed object already
// matches (see apply.go). It reports whether it wrote.
func (r *CacheProfileReconciler) apply(ctx context.Context, obj client.Object) (bool, error) {
	desired, err := toApplyObject(r.Scheme, obj)
	if err != nil {
		return false, err
	}
	observed, err := r.observedFor(ctx, desired.GroupVersionKind(), client.ObjectKeyFromObject(desired))
	if apierrors.IsNotFound(err) {
		observed, err = nil, nil
	}
	if err != nil {
		return false, err
	}
	return r.applyDesired(ctx, desired, observed)
}

// applyAgainst is apply with the observed object already read (nil: it
// does not exist).
func (r *CacheProfileReconciler) applyAgainst(ctx context.Context, obj client.Object, observed *unstructured.Unstructured) (bool, error) {
	desired, err := toApplyObject(r.Scheme, obj)
	if err != nil {
		return false, err
	}
	return r.applyDesired(ctx, desired, observed)
}

func (r *CacheProfileReconciler) applyDesired(ctx context.Context, desired, observed *unstructured.Unstructured) (bool, error) {
	need, why := NeedsApply(desired, observed)
	if !need {
		return false, nil
	}
	log.FromContext(ctx).V(1).Info("applying", "kind", desired.GetKind(), "name", desired.GetName(), "why", why)
	//nolint:staticcheck // Patch with client.Apply accepts unstructured objects; Client.Apply needs generated apply configurations.
	return true, r.Client.Patch(ctx, desired, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership)
}

func (r *CacheProfileReconciler) deleteIfOurs(ctx context.Context, obj client.Object) error {
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if obj.GetLabels()[LabelManagedBy] != ManagedByValue {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, obj))
}

// observe reads the workloads and the APIService after applying, and finds
// shard StatefulSets left over from a larger shard count.
func (r *CacheProfileReconciler) observe(ctx context.Context, p *cachev1alpha1.CacheProfile, d *Desired) (Observed, error) {
	obs := Observed{Shards: map[string]*appsv1.StatefulSet{}}
	var list appsv1.StatefulSetList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Options.Namespace),
		client.MatchingLabels{LabelProfile: p.Name, LabelComponent: ComponentShard}); err != nil {
		return obs, err
	}
	wanted := map[string]bool{}
	for _, s := range d.Shards {
		wanted[s.Name] = true
	}
	for i := range list.Items {
		s := &list.Items[i]
		if wanted[s.Name] {
			obs.Shards[s.Name] = s
		} else {
			obs.SurplusShards = append(obs.SurplusShards, s.Name)
		}
	}
	slices.Sort(obs.SurplusShards)
	var front appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(d.Front), &front); err == nil {
		obs.Front = &front
	} else if !apierrors.IsNotFound(err) {
		return obs, err
	}
	if d.APIService != nil {
		var a apiregv1.APIService
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(d.APIService), &a); err == nil {
			obs.APIService = &a
		} else if !apierrors.IsNotFound(err) {
			return obs, err
		}
	}
	return obs, nil
}

// handleNodeLoss deletes the fleet's pods that Kubernetes evicted from an
// unreachable node and returns the nodes that are not Ready with fleet pods
// on them (see nodeloss.go).
func (r *CacheProfileReconciler) handleNodeLoss(ctx context.Context, p *cachev1alpha1.CacheProfile) ([]NodeProblem, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.Options.Namespace),
		client.MatchingLabels{LabelProfile: p.Name, LabelManagedBy: ManagedByValue}); err != nil {
		return nil, err
	}
	nodes := map[string]*corev1.Node{}
	for _, pod := range pods.Items {
		name := pod.Spec.NodeName
		if _, seen := nodes[name]; seen || name == "" {
			continue
		}
		var n corev1.Node
		switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &n); {
		case apierrors.IsNotFound(err):
			nodes[name] = nil
		case err != nil:
			return nil, err
		default:
			nodes[name] = &n
		}
	}
	loss := FindNodeLoss(pods.Items, nodes)
	logger := log.FromContext(ctx)
	deleted := map[types.UID]bool{}
	for _, lp := range loss.Delete {
		pod := lp.Pod
		err := r.Client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue // gone already, or a new pod of the same name
		}
		if err != nil {
			return nil, fmt.Errorf("deleting pod %s left on unreachable node %s: %w", pod.Name, pod.Spec.NodeName, err)
		}
		why := fmt.Sprintf("deleted pod %s of %s from node %s, unreachable since %s: Kubernetes evicted it, and its kubelet cannot complete the deletion; it is replaced on another node",
			pod.Name, lp.Part, pod.Spec.NodeName, lp.Since.UTC().Format(time.RFC3339))
		logger.Info("deleted a fleet pod left on an unreachable node", "pod", pod.Name, "part", lp.Part, "node", pod.Spec.NodeName,
			"unreachableSince", lp.Since, "evictedAt", pod.DeletionTimestamp)
		r.Metrics.LostPodDeleted(p.Name, lp.Component)
		// The pod as the related object: events.k8s.io's recorder merges
		// events that differ only in their note into one series, which
		// would name the first pod deleted and count the others.
		if r.Recorder != nil {
			r.Recorder.Eventf(p, pod, corev1.EventTypeWarning, "LostPodDeleted", "Delete", "%s", why)
		}
		deleted[pod.UID] = true
	}
	if len(deleted) == 0 {
		return loss.Problems, nil
	}
	// The status describes the pods that are left.
	left := slices.DeleteFunc(pods.Items, func(pod corev1.Pod) bool { return deleted[pod.UID] })
	return FindNodeLoss(left, nodes).Problems, nil
}

// shardsSettled: every desired shard runs the current spec with all its
// replicas ready, so the hash shards of surplus shards have a ready home,
// and every front replica runs the current topology, so no front reads a
// surplus shard any more. (Without the second half the first real-node run
// removed the surplus shard while old fronts still dialled it: reads
// answered "shard fleet-shard-2 is unreachable" until they were replaced.)
//
// "The current spec" is the desired pod template's config hash, not only
// a finished rollout: obs comes from the informer cache, which right after
// this reconcile's apply may still hold the previous Deployment, settled
// on the previous topology.
//
// A finished rollout is not yet enough either: see frontDrained. wait is
// non-zero when only frontDrained's time bound is left.
func shardsSettled(d *Desired, obs Observed, now time.Time) (settled bool, wait time.Duration) {
	for _, want := range d.Shards {
		s := obs.Shards[want.Name]
		if s == nil || !sameConfig(&want.Spec.Template, &s.Spec.Template) ||
			statefulSetRollingOut(s) || s.Status.ReadyReplicas < *s.Spec.Replicas {
			return false, 0
		}
	}
	f := obs.Front
	if f == nil || !sameConfig(&d.Front.Spec.Template, &f.Spec.Template) ||
		deploymentRollingOut(f) || f.Status.AvailableReplicas < *f.Spec.Replicas {
		return false, 0
	}
	return frontDrained(f, now)
}

// frontDrained: no pod of an earlier front template is left. A rolled-out
// Deployment counts only pods that are not terminating, but a replaced
// front pod keeps serving through its preStop sleep and graceful shutdown
// (FrontShutdownDelaySeconds and more) — with the previous topology. CI met
// one such read of a shard removed under it ("connection refused").
//
// The Deployment reports its terminating pods in status.terminatingReplicas
// (DeploymentReplicaSetTerminatingReplicas, beta and on by default since
// Kubernetes 1.35); the status update that brings it to 0 triggers the next
// reconcile. Older control planes leave it unset: then the bound is the
// time the rollout completed (the Progressing condition's NewReplicaSetAvailable
// update, set once the last old pod was deleted) plus the pods' termination
// grace period, after which the kubelet has killed every old pod.
func frontDrained(f *appsv1.Deployment, now time.Time) (bool, time.Duration) {
	if t := f.Status.TerminatingReplicas; t != nil {
		return *t == 0, 0
	}
	var completed time.Time
	for _, c := range f.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Reason == deploymentCompleteReason {
			completed = c.LastUpdateTime.Time
		}
	}
	if completed.IsZero() {
		// No record of when the rollout ended (a Deployment without a
		// progress deadline has no Progressing condition): nothing to
		// count the grace period from, so trust the rollout.
		return true, 0
	}
	grace := time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
	if g := f.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if left := completed.Add(grace).Sub(now); left > 0 {
		return false, left
	}
	return true, 0
}

// deploymentCompleteReason is the Progressing condition's reason once a
// rollout has completed (k8s.io/kubernetes/pkg/controller/deployment/util
// NewRSAvailableReason).
const deploymentCompleteReason = "NewReplicaSetAvailable"

// sameConfig: the observed pod template carries the desired rendered
// configuration (AnnotationConfigHash).
func sameConfig(want, got *corev1.PodTemplateSpec) bool {
	return got.Annotations[AnnotationConfigHash] == want.Annotations[AnnotationConfigHash]
}

func (r *CacheProfileReconciler) deleteSurplusShard(ctx context.Context, name string) error {
	key := metav1.ObjectMeta{Name: name, Namespace: r.Options.Namespace}
	if err := client.IgnoreNotFound(r.Client.Delete(ctx, &appsv1.StatefulSet{ObjectMeta: key})); err != nil {
		return err
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: key}))
}

// writeStatus updates the status only when it changed and emits events for
// the transitions a user cares about.
func (r *CacheProfileReconciler) writeStatus(ctx context.Context, p *cachev1alpha1.CacheProfile, obs Observed, now time.Time) error {
	st := ComputeStatus(p, r.Options, obs, now)
	r.Metrics.Seen(p.Name)
	if equality.Semantic.DeepEqual(st, p.Status) {
		return nil
	}
	for _, t := range []string{cachev1alpha1.ConditionAvailable, cachev1alpha1.ConditionDegraded} {
		old, cur := meta.FindStatusCondition(p.Status.Conditions, t), meta.FindStatusCondition(st.Conditions, t)
		if cur == nil || (old != nil && old.Status == cur.Status && old.Reason == cur.Reason) {
			continue
		}
		kind := corev1.EventTypeNormal
		if (t == cachev1alpha1.ConditionDegraded) == (cur.Status == metav1.ConditionTrue) {
			kind = corev1.EventTypeWarning
		}
		if old == nil && cur.Status == metav1.ConditionFalse && t == cachev1alpha1.ConditionDegraded {
			continue // "not degraded" on creation is not news
		}
		r.event(p, kind, t+string(cur.Status), "Status", cur.Reason+": "+cur.Message)
	}
	p.Status = st
	err := r.Client.Status().Update(ctx, p)
	if apierrors.IsConflict(err) {
		// The cache had an older profile; the newer one's watch event is on
		// its way and triggers another reconcile. Not an error worth a log.
		log.FromContext(ctx).V(1).Info("status update conflict, waiting for the newer profile")
		return nil
	}
	return err
}

// finalize deletes every child, cluster-scoped ones and the kube-system
// RoleBinding included, then releases the profile.
func (r *CacheProfileReconciler) finalize(ctx context.Context, p *cachev1alpha1.CacheProfile) (ctrl.Result, error) {
	if !slices.Contains(p.Finalizers, Finalizer) {
		return ctrl.Result{}, nil
	}
	remaining, err := r.deleteChildren(ctx, p)
	if err != nil {
		return ctrl.Result{}, err
	}
	if remaining > 0 {
		// Deletion is asynchronous for objects with finalizers of their own;
		// check again shortly rather than waiting for a watch event.
		return ctrl.Result{RequeueAfter: 500 * time.Millisecond}, nil
	}
	r.Metrics.Forget(p.Name)
	patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
	p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == Finalizer })
	return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, p, patch))
}

// childLists are the kinds of children; each is listed by the profile label.
func childLists() []client.ObjectList {
	return []client.ObjectList{
		&appsv1.StatefulSetList{}, &appsv1.DeploymentList{}, &corev1.ServiceList{}, &corev1.ServiceAccountList{},
		&corev1.ConfigMapList{}, &corev1.SecretList{}, &policyv1.PodDisruptionBudgetList{},
		&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}, &rbacv1.RoleBindingList{}, &rbacv1.RoleList{}, &apiregv1.APIServiceList{},
	}
}

func (r *CacheProfileReconciler) deleteChildren(ctx context.Context, p *cachev1alpha1.CacheProfile) (int, error) {
	sel := client.MatchingLabels{LabelProfile: p.Name, LabelManagedBy: ManagedByValue}
	remaining := 0
	for _, l := range childLists() {
		if err := r.Client.List(ctx, l, sel); err != nil {
			return 0, err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return 0, err
		}
		for _, it := range items {
			o := it.(client.Object)
			if !o.GetDeletionTimestamp().IsZero() {
				remaining++ // still finalizing
				continue
			}
			err := r.Client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground))
			switch {
			case apierrors.IsNotFound(err): // already gone, the cache lags
			case err != nil:
				return 0, err
			default:
				remaining++ // confirm on the next pass that it is gone
			}
		}
	}
	mon, err := r.monitoring(ctx)
	if err != nil {
		return 0, err
	}
	var unstructuredChildren []client.Object
	if mon.ServiceMonitor {
		unstructuredChildren = append(unstructuredChildren, BuildServiceMonitor(p, r.Options))
	}
	if mon.PrometheusRule {
		pr, err := BuildPrometheusRule(p, r.Options)
		if err != nil {
			return 0, err
		}
		unstructuredChildren = append(unstructuredChildren, pr)
	}
	for _, o := range unstructuredChildren {
		err := r.Client.Delete(ctx, o)
		if err == nil {
			remaining++
		} else if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return 0, err
		}
	}
	return remaining, nil
}

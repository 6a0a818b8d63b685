package observability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// workload writes configmaps through the apiserver and reads them through
// the tier (status.serverURL, through the aggregator) the ways clients do:
// consistent and paginated LISTs in JSON and protobuf, GETs, a long watch
// and repeated watch-lists, as the cluster admin and as a user who may only
// view. Errors are counted, not fatal: the test kills a shard while it
// runs.
type workload struct {
	writes, reads, watchEvents, watchLists, errors atomic.Int64
	lastErr                                        atomic.Value
	cancel                                         context.CancelFunc
	wg                                             sync.WaitGroup
}

func (w *workload) fail(err error) {
	w.errors.Add(1)
	w.lastErr.Store(err.Error())
}

func (w *workload) String() string {
	last, _ := w.lastErr.Load().(string)
	return fmt.Sprintf("%d writes, %d reads, %d watch events, %d watch-lists, %d errors (last: %s)",
		w.writes.Load(), w.reads.Load(), w.watchEvents.Load(), w.watchLists.Load(), w.errors.Load(), last)
}

// open opens a watch; a failure counts unless the workload is stopping.
func (w *workload) open(ctx context.Context, open func() (watch.Interface, error)) watch.Interface {
	wi, err := open()
	if err != nil {
		if ctx.Err() == nil {
			w.fail(err)
		}
		return nil
	}
	return wi
}

func (w *workload) stop() { w.cancel(); w.wg.Wait() }

func startWorkload(t *testing.T, e *env, serverURL string) *workload {
	ctx, cancel := context.WithCancel(context.Background())
	w := &workload{cancel: cancel}
	tierCfg := rest.CopyConfig(e.in.Admin)
	tierCfg.Host = serverURL
	tierJSON := kubernetes.NewForConfigOrDie(tierCfg)
	protoCfg := rest.CopyConfig(tierCfg)
	protoCfg.ContentType = "application/vnd.kubernetes.protobuf"
	protoCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	tierProto := kubernetes.NewForConfigOrDie(protoCfg)
	tierViewer := viewerClient(t, e, tierCfg)
	namespaces := nodeinstall.CachedNamespaces
	loop := func(every time.Duration, f func(i int)) {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				f(i)
				select {
				case <-ctx.Done():
				case <-time.After(every):
				}
			}
		}()
	}
	// Writes: a configmap's data changes, through the apiserver.
	loop(100*time.Millisecond, func(i int) {
		n := namespaces[i%len(namespaces)]
		patch := fmt.Sprintf(`{"data":{"tick":"%d"}}`, i)
		name := fmt.Sprintf("cm-%03d", i%nodeinstall.ConfigMapsPerNamespace)
		if _, err := e.in.Client.CoreV1().ConfigMaps(n).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil && ctx.Err() == nil {
			w.fail(err)
			return
		}
		w.writes.Add(1)
	})
	// Reads through the tier. The admin (system:masters) is exempt from
	// priority and fairness; the viewer is not: its requests are charged
	// seats and queue in global-default, as most clients' do.
	for _, c := range []kubernetes.Interface{tierJSON, tierProto, tierViewer} {
		c := c
		loop(200*time.Millisecond, func(i int) {
			n := namespaces[i%len(namespaces)]
			var err error
			switch i % 3 {
			case 0: // consistent read: waits for the apiserver's current RV
				_, err = c.CoreV1().ConfigMaps(n).List(ctx, metav1.ListOptions{})
			case 1:
				_, err = c.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 5})
			case 2:
				_, err = c.CoreV1().ConfigMaps(n).Get(ctx, fmt.Sprintf("cm-%03d", i%nodeinstall.ConfigMapsPerNamespace), metav1.GetOptions{})
			}
			if err != nil && ctx.Err() == nil {
				w.fail(err)
				return
			}
			w.reads.Add(1)
		})
	}
	// A long watch of every cached configmap, reopened when it ends.
	loop(time.Second, func(int) {
		wi := w.open(ctx, func() (watch.Interface, error) {
			return tierJSON.CoreV1().ConfigMaps("").Watch(ctx, metav1.ListOptions{AllowWatchBookmarks: true})
		})
		if wi == nil {
			return
		}
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				w.fail(fmt.Errorf("watch error event: %v", ev.Object))
				return
			}
			w.watchEvents.Add(1)
		}
	})
	// Watch-lists (sendInitialEvents), each read to its
	// initial-events-end bookmark, as informers with WatchListClient do.
	loop(2*time.Second, func(i int) {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		c := []kubernetes.Interface{tierJSON, tierProto}[i%2]
		wi := w.open(ctx, func() (watch.Interface, error) {
			return c.CoreV1().ConfigMaps(namespaces[i%len(namespaces)]).Watch(wctx, metav1.ListOptions{
				SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true,
			})
		})
		if wi == nil {
			return
		}
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Bookmark {
				if m, err := apimeta.Accessor(ev.Object); err == nil && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
					w.watchLists.Add(1)
					return
				}
			}
		}
		if ctx.Err() == nil {
			w.fail(fmt.Errorf("watch-list ended before its initial-events-end bookmark"))
		}
	})
	t.Cleanup(w.stop)
	return w
}

// viewer is the user the workload also reads as: bound to the cluster's
// view ClusterRole only, which the operator's reader ClusterRole for the
// profile is aggregated into.
const viewer = "olivia"

// viewerClient binds viewer to view and returns a client of the tier that
// impersonates it (the aggregator passes the impersonated user on), once a
// read through the tier succeeds: a read before the binding reached the
// authorizers would be refused, and the refusal cached.
func viewerClient(t *testing.T, e *env, tierCfg *rest.Config) kubernetes.Interface {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.in.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "view-" + viewer},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: viewer}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The apiserver's RBAC authorizer sees the binding within moments.
	review := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: viewer, Groups: []string{"viewers", "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: "list", Resource: "configmaps"},
	}}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := e.in.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("%s may not list configmaps after 30s: %v", viewer, err)
	}
	cfg := rest.CopyConfig(tierCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: viewer, Groups: []string{"viewers"}}
	c := kubernetes.NewForConfigOrDie(cfg)
	if _, err := c.CoreV1().ConfigMaps(nodeinstall.CachedNamespaces[0]).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Fatalf("%s cannot read configmaps through the tier: %v", viewer, err)
	}
	return c
}

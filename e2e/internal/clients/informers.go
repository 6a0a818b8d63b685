// Package clients are the clients the end-to-end tests on real nodes run
// while things happen to a fleet: informers reading through the tier, a
// writer changing what they cache at the apiserver, and a reader loop of
// consistent LISTs and GETs that counts what failed. At the end the
// informers must hold exactly what the apiserver holds.
package clients

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// State is key (namespace/name) → resourceVersion.
type State map[string]string

// DiffStates lists how got differs from want, at most ten lines.
func DiffStates(want, got State) string {
	var d []string
	for k, v := range want {
		if got[k] != v {
			d = append(d, fmt.Sprintf("%s: want rv %s, got %q", k, v, got[k]))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("%s: unexpected (rv %s)", k, v))
		}
	}
	sort.Strings(d)
	if len(d) > 10 {
		d = append(d[:10], fmt.Sprintf("... %d more", len(d)-10))
	}
	return strings.Join(d, "\n")
}

// StoreState is what an informer's store holds.
func StoreState(s cache.Store) State {
	out := State{}
	for _, o := range s.List() {
		if m, ok := o.(metav1.Object); ok {
			out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
		}
	}
	return out
}

// Truth is what the apiserver holds of what the sample profile caches:
// every pod, and the configmaps of namespaces.
func Truth(ctx context.Context, kc kubernetes.Interface, namespaces []string) (pods, configMaps State, err error) {
	pods, configMaps = State{}, State{}
	pl, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pl.Items {
		pods[p.Namespace+"/"+p.Name] = p.ResourceVersion
	}
	for _, ns := range namespaces {
		cl, err := kc.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, err
		}
		for _, cm := range cl.Items {
			configMaps[cm.Namespace+"/"+cm.Name] = cm.ResourceVersion
		}
	}
	return pods, configMaps, nil
}

// Informers read through the tier: typed configmaps and metadata-only
// pods, as a controller and a node agent would.
type Informers struct {
	cancel       context.CancelFunc
	tier         *rest.Config
	typed        informers.SharedInformerFactory
	meta         metadatainformer.SharedInformerFactory
	ConfigMaps   cache.SharedIndexInformer
	PodsMetadata cache.SharedIndexInformer

	mu          sync.Mutex
	watchErrors []string // the last watch errors, for a failure's report
}

// watchErrorsKept is how many of the informers' last watch errors a
// failure reports.
const watchErrorsKept = 20

// recordWatchErrors keeps what ended an informer's watch (and logs it as
// client-go's default handler does): when the informers differ from the
// apiserver, the report says whether their watches were failing.
func (r *Informers) recordWatchErrors(name string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, rf *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, rf, err)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.watchErrors = append(r.watchErrors, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), name, err))
		if len(r.watchErrors) > watchErrorsKept {
			r.watchErrors = r.watchErrors[len(r.watchErrors)-watchErrorsKept:]
		}
	}
}

// StartInformers starts them and waits until they synced (2 minutes at
// most). client-go's WatchListClient feature is whatever the test set.
func StartInformers(t *testing.T, tier *rest.Config) *Informers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Informers{cancel: cancel, tier: tier}
	r.typed = informers.NewSharedInformerFactory(kubernetes.NewForConfigOrDie(tier), 0)
	r.ConfigMaps = r.typed.Core().V1().ConfigMaps().Informer()
	r.meta = metadatainformer.NewSharedInformerFactory(metadata.NewForConfigOrDie(tier), 0)
	r.PodsMetadata = r.meta.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	for name, inf := range map[string]cache.SharedIndexInformer{"configmaps": r.ConfigMaps, "pods (metadata)": r.PodsMetadata} {
		if err := inf.SetWatchErrorHandlerWithContext(r.recordWatchErrors(name)); err != nil {
			t.Fatal(err)
		}
	}
	r.typed.Start(ctx.Done())
	r.meta.Start(ctx.Done())
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), r.ConfigMaps.HasSynced, r.PodsMetadata.HasSynced) {
		r.Stop()
		t.Fatal("informers through the tier did not sync within 2 minutes")
	}
	return r
}

// Stop ends the informers.
func (r *Informers) Stop() {
	r.cancel()
	r.typed.Shutdown()
	r.meta.Shutdown()
}

// Converge is how long informers may take to catch up after a run of
// faults. client-go's reflector waits between failed list-and-watches with
// a backoff of up to 30 s and a jitter that doubles it at most: on a loaded
// CI machine, freshness timeouts (504) while pods roll can cost two such
// waits before a relist succeeds.
const Converge = 4 * time.Minute

// WaitSame polls until the informers hold exactly what the apiserver
// (kc) holds, key by key and resourceVersion by resourceVersion, for the
// configmaps of namespaces and every pod. When they do not within
// timeout, the report has the last difference seen, what a consistent
// LIST through the tier holds at that point (a tier behind the apiserver,
// or only its watch streams), and the informers' last watch errors.
func (r *Informers) WaitSame(t *testing.T, kc kubernetes.Interface, namespaces []string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	lastDiff, lastErr := "none seen: the apiserver never answered", error(nil)
	for {
		bad, err := r.differences(kc, namespaces)
		switch {
		case err != nil:
			lastErr = err
		case bad == "":
			return
		default:
			lastDiff, lastErr = bad, nil
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				lastDiff += fmt.Sprintf("\n(the apiserver's last answer: %v)", lastErr)
			}
			t.Fatalf("informers through the tier differ from the apiserver after %s:\n%s\n%s\n%s\ninformers' last watch errors:\n%s",
				timeout, lastDiff, r.tierListDifferences(kc, namespaces), r.storeSizes(), r.lastWatchErrors())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// differences is how the informers differ from the apiserver now ("" when
// they do not).
func (r *Informers) differences(kc kubernetes.Interface, namespaces []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, cms, err := Truth(ctx, kc, namespaces)
	if err != nil {
		return "", err
	}
	bad := ""
	if d := DiffStates(cms, StoreState(r.ConfigMaps.GetStore())); d != "" {
		bad += "typed configmaps informer:\n" + d + "\n"
	}
	if d := DiffStates(pods, StoreState(r.PodsMetadata.GetStore())); d != "" {
		bad += "metadata pods informer:\n" + d + "\n"
	}
	return bad, nil
}

// tierListDifferences compares consistent LISTs through the tier with the
// apiserver's, to tell a tier whose store is behind from watch streams
// that stopped delivering.
func (r *Informers) tierListDifferences(kc kubernetes.Interface, namespaces []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tierPods, tierCMs, err := Truth(ctx, kubernetes.NewForConfigOrDie(r.tier), namespaces)
	if err != nil {
		return "consistent LISTs through the tier: " + err.Error()
	}
	pods, cms, err := Truth(ctx, kc, namespaces)
	if err != nil {
		return "the apiserver's LISTs: " + err.Error()
	}
	d := DiffStates(cms, tierCMs) + DiffStates(pods, tierPods)
	if d == "" {
		return "consistent LISTs through the tier equal the apiserver's: the tier holds the data, its watch streams did not deliver it"
	}
	return "consistent LISTs through the tier differ from the apiserver's too:\n" + d
}

// storeSizes says how much each informer holds and the resourceVersion
// its reflector last synced to: an informer whose store emptied (a relist
// answered with too little) reads differently from one whose watch stalled
// (its RV stays behind).
func (r *Informers) storeSizes() string {
	var b strings.Builder
	for _, i := range []struct {
		name string
		inf  cache.SharedIndexInformer
	}{{"typed configmaps", r.ConfigMaps}, {"metadata pods", r.PodsMetadata}} {
		fmt.Fprintf(&b, "%s informer: %d objects, last synced resourceVersion %q\n", i.name, len(i.inf.GetStore().ListKeys()), i.inf.LastSyncResourceVersion())
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func (r *Informers) lastWatchErrors() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.watchErrors) == 0 {
		return "  none"
	}
	return "  " + strings.Join(r.watchErrors, "\n  ")
}

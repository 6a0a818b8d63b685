package install

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
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

// items parses `kubectl ... -o json` into its items by namespace/name.
func items(t *testing.T, out string) (keys []string, byKey map[string]json.RawMessage) {
	t.Helper()
	var list struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("kubectl output is not a JSON list: %v\n%s", err, clip(out))
	}
	byKey = map[string]json.RawMessage{}
	for _, raw := range list.Items {
		var m struct {
			Metadata struct{ Namespace, Name string } `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		k := m.Metadata.Namespace + "/" + m.Metadata.Name
		keys = append(keys, k)
		byKey[k] = raw
	}
	return keys, byKey
}

// compareJSON runs `kubectl <args> -o json` against the apiserver, the tier,
// and the apiserver again. A consistent read from the tier is at least as
// fresh as the first apiserver answer and not fresher than the second, so
// when those two agree the tier must give the same items in the same order,
// object for object; when they differ (the kubelet updated a pod in
// between) the comparison is repeated.
func (e *env) compareJSON(t *testing.T, apiKubeconfig, tierKubeconfig string, args ...string) int {
	t.Helper()
	return e.compareJSONAs(t, apiKubeconfig, tierKubeconfig, args, args)
}

// compareJSONAs is compareJSON with different arguments for the apiserver,
// for what the profile itself filters (its labelSelector).
func (e *env) compareJSONAs(t *testing.T, apiKubeconfig, tierKubeconfig string, apiArgs, tierArgs []string) int {
	t.Helper()
	args := append(append([]string{}, tierArgs...), "-o", "json")
	apiArgs = append(append([]string{}, apiArgs...), "-o", "json")
	for attempt := 0; ; attempt++ {
		before := e.mustKubectl(t, apiKubeconfig, apiArgs...)
		tier := e.mustKubectl(t, tierKubeconfig, args...)
		after := e.mustKubectl(t, apiKubeconfig, apiArgs...)
		wantKeys, want := items(t, before)
		afterKeys, afterItems := items(t, after)
		if !reflect.DeepEqual(wantKeys, afterKeys) || !sameItems(want, afterItems) {
			if attempt == 10 {
				t.Fatalf("kubectl %s: the apiserver's answer never held still over 10 attempts", strings.Join(args, " "))
			}
			time.Sleep(time.Second)
			continue
		}
		gotKeys, got := items(t, tier)
		if len(wantKeys) == 0 {
			t.Fatalf("kubectl %s: the apiserver returned nothing; the case tests nothing", strings.Join(args, " "))
		}
		if !reflect.DeepEqual(gotKeys, wantKeys) {
			t.Fatalf("kubectl %s: items differ\ntier (%d):      %v\napiserver (%d): %v", strings.Join(args, " "), len(gotKeys), gotKeys, len(wantKeys), wantKeys)
		}
		for _, k := range wantKeys {
			if !jsonEqual(got[k], want[k]) {
				t.Fatalf("kubectl %s: %s differs\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), k, got[k], want[k])
			}
		}
		return len(wantKeys)
	}
}

func sameItems(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !jsonEqual(v, b[k]) {
			return false
		}
	}
	return true
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// state is key → resourceVersion.
type state map[string]string

func diffStates(want, got state) string {
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

func storeState(s cache.Store) state {
	out := state{}
	for _, o := range s.List() {
		if m, ok := o.(metav1.Object); ok {
			out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
		}
	}
	return out
}

// truth is what the apiserver holds of what the sample profile caches:
// every pod, and the configmaps of the cached namespaces.
func (e *env) truth(ctx context.Context) (pods, configMaps state, err error) {
	pods, configMaps = state{}, state{}
	pl, err := e.kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pl.Items {
		pods[p.Namespace+"/"+p.Name] = p.ResourceVersion
	}
	for _, ns := range cachedNamespaces {
		cl, err := e.kc.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, err
		}
		for _, cm := range cl.Items {
			configMaps[cm.Namespace+"/"+cm.Name] = cm.ResourceVersion
		}
	}
	return pods, configMaps, nil
}

// readers are informers reading through the tier: typed configmaps and
// metadata-only pods, as a controller and a node agent would.
type readers struct {
	cancel       context.CancelFunc
	typed        informers.SharedInformerFactory
	meta         metadatainformer.SharedInformerFactory
	configMaps   cache.SharedIndexInformer
	podsMetadata cache.SharedIndexInformer
}

func startReaders(t *testing.T, tier *rest.Config) *readers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &readers{cancel: cancel}
	r.typed = informers.NewSharedInformerFactory(kubernetes.NewForConfigOrDie(tier), 0)
	r.configMaps = r.typed.Core().V1().ConfigMaps().Informer()
	r.meta = metadatainformer.NewSharedInformerFactory(metadata.NewForConfigOrDie(tier), 0)
	r.podsMetadata = r.meta.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	r.typed.Start(ctx.Done())
	r.meta.Start(ctx.Done())
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), r.configMaps.HasSynced, r.podsMetadata.HasSynced) {
		r.stop()
		t.Fatal("informers through the tier did not sync within 2 minutes")
	}
	return r
}

func (r *readers) stop() {
	r.cancel()
	r.typed.Shutdown()
	r.meta.Shutdown()
}

// waitSame polls until the informers hold exactly what the apiserver holds,
// key by key and resourceVersion by resourceVersion.
func (e *env) waitSame(t *testing.T, r *readers, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		pods, cms, err := e.truth(ctx)
		bad := ""
		if err != nil {
			bad = err.Error()
		} else {
			if d := diffStates(cms, storeState(r.configMaps.GetStore())); d != "" {
				bad += "typed configmaps informer:\n" + d + "\n"
			}
			if d := diffStates(pods, storeState(r.podsMetadata.GetStore())); d != "" {
				bad += "metadata pods informer:\n" + d + "\n"
			}
		}
		if bad == "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("informers through the tier differ from the apiserver after %s:\n%s", timeout, bad)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

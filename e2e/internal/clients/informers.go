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
	typed        informers.SharedInformerFactory
	meta         metadatainformer.SharedInformerFactory
	ConfigMaps   cache.SharedIndexInformer
	PodsMetadata cache.SharedIndexInformer
}

// StartInformers starts them and waits until they synced (2 minutes at
// most). client-go's WatchListClient feature is whatever the test set.
func StartInformers(t *testing.T, tier *rest.Config) *Informers {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Informers{cancel: cancel}
	r.typed = informers.NewSharedInformerFactory(kubernetes.NewForConfigOrDie(tier), 0)
	r.ConfigMaps = r.typed.Core().V1().ConfigMaps().Informer()
	r.meta = metadatainformer.NewSharedInformerFactory(metadata.NewForConfigOrDie(tier), 0)
	r.PodsMetadata = r.meta.ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
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

// WaitSame polls until the informers hold exactly what the apiserver
// (kc) holds, key by key and resourceVersion by resourceVersion, for the
// configmaps of namespaces and every pod.
func (r *Informers) WaitSame(t *testing.T, kc kubernetes.Interface, namespaces []string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		pods, cms, err := Truth(ctx, kc, namespaces)
		bad := ""
		if err != nil {
			bad = err.Error()
		} else {
			if d := DiffStates(cms, StoreState(r.ConfigMaps.GetStore())); d != "" {
				bad += "typed configmaps informer:\n" + d + "\n"
			}
			if d := DiffStates(pods, StoreState(r.PodsMetadata.GetStore())); d != "" {
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

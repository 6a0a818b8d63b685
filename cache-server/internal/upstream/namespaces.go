package upstream

import (
	"context"
	"maps"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// NamespaceSource is what a namespace-filtered ingester needs to know about
// namespaces: their current labels, and a call whenever they may have
// changed. NamespaceWatcher implements it over the apiserver; tests fake it.
type NamespaceSource interface {
	// Synced is closed once the initial list of namespaces is known.
	Synced() <-chan struct{}
	// Labels returns a namespace's labels and whether it exists.
	Labels(ns string) (map[string]string, bool)
	// Subscribe registers fn, called (from one goroutine, in order) with
	// the name of every namespace that was added, deleted or relabelled
	// after the call.
	Subscribe(fn func(ns string))
}

// NamespaceWatcher is the tier's one watch on namespaces, shared by every
// ingester with a namespaceSelector. It keeps only names and labels.
type NamespaceWatcher struct {
	informer cache.SharedIndexInformer
	synced   chan struct{}

	mu     sync.RWMutex
	labels map[string]map[string]string
	subs   []func(string)
}

// NewNamespaceWatcher returns a watcher; call Run to start it.
func NewNamespaceWatcher(kc kubernetes.Interface) *NamespaceWatcher {
	lw := cache.NewListWatchFromClient(kc.CoreV1().RESTClient(), "namespaces", "", fields.Everything())
	w := &NamespaceWatcher{
		informer: cache.NewSharedIndexInformer(lw, &corev1.Namespace{}, 0, cache.Indexers{}),
		synced:   make(chan struct{}),
		labels:   map[string]map[string]string{},
	}
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.set(obj, false) },
		UpdateFunc: func(_, obj any) { w.set(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			w.set(obj, true)
		},
	})
	return w
}

// Run watches until ctx is done.
func (w *NamespaceWatcher) Run(ctx context.Context) {
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
			close(w.synced)
		}
	}()
	w.informer.Run(ctx.Done())
}

func (w *NamespaceWatcher) set(obj any, deleted bool) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	w.mu.Lock()
	old, existed := w.labels[ns.Name]
	if deleted {
		delete(w.labels, ns.Name)
	} else {
		w.labels[ns.Name] = maps.Clone(ns.Labels)
	}
	changed := deleted != !existed || !maps.Equal(old, ns.Labels)
	subs := w.subs
	w.mu.Unlock()
	if !changed {
		return
	}
	// The informer calls handlers from one goroutine, in order.
	for _, fn := range subs {
		fn(ns.Name)
	}
}

// Synced implements NamespaceSource.
func (w *NamespaceWatcher) Synced() <-chan struct{} { return w.synced }

// Labels implements NamespaceSource.
func (w *NamespaceWatcher) Labels(ns string) (map[string]string, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	l, ok := w.labels[ns]
	return l, ok
}

// Subscribe implements NamespaceSource.
func (w *NamespaceWatcher) Subscribe(fn func(string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs = append(w.subs, fn)
}

package clients

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// Writer changes configmaps of the cached namespaces at the apiserver until
// halted: updates of the sample's, creations and deletions of its own, a
// few per second.
type Writer struct {
	stop context.CancelFunc
	done chan struct{}
	// Writes and Errs count what succeeded and what failed (conflicts and
	// missing objects are neither: they are the writer's own races).
	Writes, Errs atomic.Int64
}

// StartWriter starts writing with kc (the apiserver's admin client).
func StartWriter(kc kubernetes.Interface, namespaces []string) *Writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ns := namespaces[i%len(namespaces)]
			var err error
			switch i % 3 {
			case 0:
				var cm *corev1.ConfigMap
				if cm, err = kc.CoreV1().ConfigMaps(ns).Get(ctx, fmt.Sprintf("cm-%03d", i%nodeinstall.ConfigMapsPerNamespace), metav1.GetOptions{}); err == nil {
					cm.Data["value"] = fmt.Sprintf("write-%d", i)
					_, err = kc.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
				}
			case 1:
				_, err = kc.CoreV1().ConfigMaps(ns).Create(ctx, nodeinstall.SampleConfigMap(fmt.Sprintf("w-%05d", i), i), metav1.CreateOptions{})
			case 2:
				err = kc.CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("w-%05d", i-4), metav1.DeleteOptions{})
			}
			if err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				w.Errs.Add(1)
			} else if err == nil {
				w.Writes.Add(1)
			}
		}
	}()
	return w
}

// Halt stops the writer and waits until its last write returned.
func (w *Writer) Halt() {
	w.stop()
	<-w.done
}

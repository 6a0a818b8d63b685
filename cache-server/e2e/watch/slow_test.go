package watch

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestSlowWatcherIsClosedOthersKeepUp: a watcher that stops reading is
// closed once it lags too far (and counted), while a watcher that reads
// gets every event — one slow client never stalls the others.
func TestSlowWatcherIsClosedOthersKeepUp(t *testing.T) {
	forEachTier(t, testSlowWatcherIsClosedOthersKeepUp)
}

func testSlowWatcherIsClosedOthersKeepUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := nsName(2)
	api := kubernetes.NewForConfigOrDie(env.Admin)
	cms := api.CoreV1().ConfigMaps(ns)
	payload := strings.Repeat("x", 20<<10)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "firehose"}, Data: map[string]string{"p": payload}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cms.Delete(context.Background(), "firehose", metav1.DeleteOptions{})
	from := cm.ResourceVersion
	before := terminatedSlow(t)

	// The slow one: opens the stream and never reads it. Each event is
	// ~20 KiB, so HTTP/2 flow control stops the tier's writes after a few
	// MiB and the watcher's lag grows with every update.
	client, err := rest.HTTPClientFor(env.TierAdmin)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, env.TierURL+"/api/v1/namespaces/"+ns+"/configmaps?watch=true&fieldSelector=metadata.name%3Dfirehose&resourceVersion="+from, nil)
	slow, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Body.Close()

	fast, err := kubernetes.NewForConfigOrDie(env.TierAdmin).CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{
		ResourceVersion: from, FieldSelector: "metadata.name=firehose"})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Stop()

	const updates = 1500 // more than the 1,000-event lag a watcher may have
	done := make(chan int)
	go func() {
		n := 0
		for ev := range fast.ResultChan() {
			if ev.Type == watch.Modified {
				if n++; n == updates {
					break
				}
			}
		}
		done <- n
	}()
	for i := 0; i < updates; i++ {
		cm.Data["i"] = fmt.Sprint(i)
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case n := <-done:
		if n != updates {
			t.Fatalf("the reading watcher got %d of %d updates", n, updates)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the reading watcher did not get every update within 60s")
	}
	if after := terminatedSlow(t); after <= before {
		t.Fatalf("cachetier_watchers_terminated_total{reason=slow} stayed at %v", after)
	}
	// The slow stream ends (the client re-watches from its last RV)
	// without having delivered every update.
	got := 0
	sc := bufio.NewScanner(slow.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		got++
	}
	if got >= updates {
		t.Fatalf("the slow watcher received all %d events; it should have been closed", got)
	}
	t.Logf("slow watcher closed after %d of %d events", got, updates)
}

func terminatedSlow(t *testing.T) float64 {
	t.Helper()
	v, err := env.Metric(`cachetier_watchers_terminated_total{reason="slow",resource="configmaps"}`)
	if err != nil {
		t.Fatal(err)
	}
	var f float64
	fmt.Sscanf(v, "%g", &f)
	return f
}

package watch

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

type rawEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

type evMeta struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
		Labels          map[string]string `json:"labels"`
	} `json:"metadata"`
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func (e rawEvent) meta() evMeta {
	var m evMeta
	_ = json.Unmarshal(e.Object, &m)
	return m
}

// openWatch starts a raw watch and returns its events on a channel
// (closed when the stream ends) and the HTTP status.
func openWatch(t *testing.T, ctx context.Context, cfg *rest.Config, path string, q url.Values, accept string) (<-chan rawEvent, int) {
	t.Helper()
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := strings.TrimRight(cfg.Host, "/") + cfg.APIPath + path + "?" + q.Encode()
	if cfg.APIPath == "" {
		u = strings.TrimRight(cfg.Host, "/") + path + "?" + q.Encode()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan rawEvent, 10000)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		close(ch)
		return ch, resp.StatusCode
	}
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var ev rawEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				ev = rawEvent{Type: "UNPARSABLE", Object: json.RawMessage(strconv.Quote(sc.Text()))}
			}
			ch <- ev
		}
	}()
	return ch, resp.StatusCode
}

// collect reads events until pred says stop or the timeout passes.
func collect(ch <-chan rawEvent, timeout time.Duration, done func([]rawEvent) bool) []rawEvent {
	var out []rawEvent
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, ev)
			if done(out) {
				return out
			}
		case <-deadline:
			return out
		}
	}
}

func kc(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func describe(evs []rawEvent, withBookmarks bool) []string {
	var out []string
	for _, e := range evs {
		m := e.meta()
		if e.Type == "BOOKMARK" {
			if withBookmarks {
				out = append(out, fmt.Sprintf("BOOKMARK end=%s", m.Metadata.Annotations["k8s.io/initial-events-end"]))
			}
			continue
		}
		out = append(out, fmt.Sprintf("%s %s/%s rv=%s", e.Type, m.Metadata.Namespace, m.Metadata.Name, m.Metadata.ResourceVersion))
	}
	return out
}

// TestCompareScriptedWatch sends the same watch requests to the apiserver
// and the tier, runs a scripted change sequence, and compares the events.
func TestCompareScriptedWatch(t *testing.T) { forEachTier(t, testCompareScriptedWatch) }

func testCompareScriptedWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	api := kc(t, env.Admin)
	ns := nsName(0)
	list, err := api.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := list.ResourceVersion
	path := "/api/v1/namespaces/" + ns + "/configmaps"
	cases := map[string]url.Values{
		"from-rv-selector":   {"watch": {"true"}, "resourceVersion": {rv}, "labelSelector": {"app=a"}},
		"from-rv-all":        {"watch": {"true"}, "resourceVersion": {rv}},
		"from-rv-field":      {"watch": {"true"}, "resourceVersion": {rv}, "fieldSelector": {"metadata.name=scripted"}},
		"watch-list":         {"watch": {"true"}, "sendInitialEvents": {"true"}, "resourceVersionMatch": {"NotOlderThan"}, "allowWatchBookmarks": {"true"}, "labelSelector": {"app=a"}},
		"legacy-rv0":         {"watch": {"true"}, "resourceVersion": {"0"}, "labelSelector": {"app=a"}},
		"rv-unset-no-events": {"watch": {"true"}, "sendInitialEvents": {"false"}, "resourceVersionMatch": {"NotOlderThan"}, "labelSelector": {"app=a"}},
	}
	type pair struct{ api, tier <-chan rawEvent }
	streams := map[string]pair{}
	for name, q := range cases {
		a, codeA := openWatch(t, ctx, env.Admin, path, q, "")
		b, codeB := openWatch(t, ctx, env.TierAdmin, path, q, "")
		if codeA != 200 || codeB != 200 {
			t.Fatalf("%s: status apiserver %d tier %d", name, codeA, codeB)
		}
		streams[name] = pair{a, b}
	}
	// Let every stream deliver its initial part before changing anything.
	time.Sleep(500 * time.Millisecond)
	cms := api.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "scripted", Labels: map[string]string{"app": "a"}}, Data: map[string]string{"v": "1"}}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	cm, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	must(err)
	cm.Data["v"] = "2"
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(err)
	cm.Labels["app"] = "b" // leaves app=a: DELETED for selector watches
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(err)
	cm.Labels["app"] = "a" // enters again: ADDED
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	must(err)
	must(cms.Delete(ctx, "scripted", metav1.DeleteOptions{}))
	marker, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "scripted-end", Labels: map[string]string{"app": "a"}}}, metav1.CreateOptions{})
	must(err)
	defer cms.Delete(context.Background(), "scripted-end", metav1.DeleteOptions{})
	endRV := marker.ResourceVersion

	untilEnd := func(evs []rawEvent) bool {
		m := evs[len(evs)-1].meta()
		return m.Metadata.ResourceVersion == endRV || (m.Metadata.Name == "scripted" && evs[len(evs)-1].Type == "DELETED" && false)
	}
	for name, p := range streams {
		timeout := 10 * time.Second
		if name == "from-rv-field" {
			// No event for the end marker: read what arrives in a while.
			timeout = 3 * time.Second
		}
		a := collect(p.api, timeout, untilEnd)
		b := collect(p.tier, timeout, untilEnd)
		da, db := describe(a, false), describe(b, false)
		if name == "watch-list" || name == "legacy-rv0" {
			// Initial events: same set, possibly in another order.
			sort.Strings(da)
			sort.Strings(db)
		}
		if strings.Join(da, "\n") != strings.Join(db, "\n") {
			t.Errorf("%s: events differ\napiserver:\n  %s\ntier:\n  %s", name, strings.Join(da, "\n  "), strings.Join(db, "\n  "))
		}
		if name == "watch-list" {
			ba, bb := bookmarks(a), bookmarks(b)
			if ba != 1 || bb != 1 {
				t.Errorf("watch-list: initial-events-end bookmarks apiserver %d tier %d", ba, bb)
			}
		}
		if len(db) == 0 {
			t.Errorf("%s: no events", name)
		}
	}
}

func bookmarks(evs []rawEvent) int {
	n := 0
	for _, e := range evs {
		if e.Type == "BOOKMARK" && e.meta().Metadata.Annotations["k8s.io/initial-events-end"] == "true" {
			n++
			var obj map[string]any
			_ = json.Unmarshal(e.Object, &obj)
			if obj["kind"] != "ConfigMap" || obj["apiVersion"] != "v1" {
				n = -100
			}
		}
	}
	return n
}

// TestWatchErrors: validation errors and the in-stream 410 compare with the
// apiserver's.
func TestWatchErrors(t *testing.T) { forEachTier(t, testWatchErrors) }

func testWatchErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := "/api/v1/configmaps"
	for name, q := range map[string]url.Values{
		"initial-events-without-match": {"watch": {"true"}, "sendInitialEvents": {"true"}},
		"exact-match":                  {"watch": {"true"}, "resourceVersion": {"1"}, "resourceVersionMatch": {"Exact"}, "sendInitialEvents": {"false"}},
		"bad-rv":                       {"watch": {"true"}, "resourceVersion": {"abc"}},
		"match-without-initial":        {"watch": {"true"}, "resourceVersionMatch": {"NotOlderThan"}},
	} {
		_, a := openWatch(t, ctx, env.Admin, path, q, "")
		_, b := openWatch(t, ctx, env.TierAdmin, path, q, "")
		if a != b || a == 200 {
			t.Errorf("%s: apiserver %d, tier %d", name, a, b)
		}
	}
	// Too old: the in-stream 410. The apiserver's own history reaches back
	// to its start on this young cluster, so only the tier's answer is
	// checked, against the cacher's shape.
	b, _ := openWatch(t, ctx, env.TierAdmin, path, url.Values{"watch": {"true"}, "resourceVersion": {"2"}}, "")
	eb := collect(b, 5*time.Second, func([]rawEvent) bool { return true })
	if len(eb) != 1 || eb[0].Type != "ERROR" {
		t.Fatalf("too old: tier %v", describe(eb, true))
	}
	if mb := eb[0].meta(); mb.Code != 410 || mb.Reason != "Expired" || !strings.HasPrefix(mb.Message, "too old resource version: 2 (") || mb.Kind != "Status" {
		t.Errorf("too old: tier %+v", mb)
	}
	// The same 410 to the metadata client (protobuf, as controller-runtime's
	// metadata informers use it): the reflector must see Expired to relist,
	// so the Status inside the protobuf stream has to decode as one.
	mw, err := metadata.NewForConfigOrDie(env.TierAdmin).Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).
		Watch(ctx, metav1.ListOptions{ResourceVersion: "2"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-mw.ResultChan():
		st, ok := ev.Object.(*metav1.Status)
		if ev.Type != "ERROR" || !ok || st.Code != 410 || st.Reason != metav1.StatusReasonExpired || !strings.HasPrefix(st.Message, "too old resource version: 2 (") {
			t.Errorf("too old, metadata client: %s %#v", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("too old, metadata client: no event in 5s")
	}
	mw.Stop()
	// Timeout and pre-timeout bookmark.
	q := url.Values{"watch": {"true"}, "resourceVersion": {"0"}, "sendInitialEvents": {"false"}, "resourceVersionMatch": {"NotOlderThan"}, "allowWatchBookmarks": {"true"}, "timeoutSeconds": {"4"}}
	start := time.Now()
	// Watch one namespace and change another: the watcher's slice does not
	// change, the resource's RV does, and the bookmark carries it.
	ch, _ := openWatch(t, ctx, env.TierAdmin, "/api/v1/namespaces/"+nsName(2)+"/configmaps", q, "")
	_, err = kc(t, env.Admin).CoreV1().ConfigMaps(nsName(3)).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bm-" + strconv.Itoa(rand.IntN(1e6))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evs := collect(ch, 20*time.Second, func([]rawEvent) bool { return false })
	if time.Since(start) > 15*time.Second {
		t.Errorf("timeoutSeconds=4 stream lasted %s", time.Since(start))
	}
	if n := len(evs); n == 0 || evs[n-1].Type != "BOOKMARK" {
		t.Errorf("want a pre-timeout bookmark last, got %v", describe(evs, true))
	}
}

// churn runs n random creates/updates/deletes of configmaps across the
// test namespaces against the apiserver.
func churn(t *testing.T, ctx context.Context, n int, prefix string) {
	api := kc(t, env.Admin)
	var wg sync.WaitGroup
	work := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ns := nsName(i % namespaces)
				name := fmt.Sprintf("%s-%d", prefix, rand.IntN(40))
				cms := api.CoreV1().ConfigMaps(ns)
				var err error
				switch rand.IntN(3) {
				case 0:
					_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "a"}}, Data: map[string]string{"i": strconv.Itoa(i)}}, metav1.CreateOptions{})
				case 1:
					var cm *corev1.ConfigMap
					if cm, err = cms.Get(ctx, name, metav1.GetOptions{}); err == nil {
						cm.Data = map[string]string{"i": strconv.Itoa(i)}
						cm.Labels = map[string]string{"app": []string{"a", "b"}[i%2]}
						_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
					}
				case 2:
					err = cms.Delete(ctx, name, metav1.DeleteOptions{})
				}
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
					t.Errorf("churn: %v", err)
				}
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

func opsCount() int {
	if s := os.Getenv("WATCH_E2E_OPS"); s != "" {
		n, _ := strconv.Atoi(s)
		return n
	}
	return 2000
}

// truth is the apiserver's configmaps, key → RV.
func truth(t *testing.T, ctx context.Context) map[string]string {
	list, err := kc(t, env.Admin).CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cm := range list.Items {
		out[cm.Namespace+"/"+cm.Name] = cm.ResourceVersion
	}
	return out
}

func storeState(s cache.Store) map[string]string {
	out := map[string]string{}
	for _, o := range s.List() {
		m, err := metaOf(o)
		if err == nil {
			out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
		}
	}
	return out
}

func metaOf(o any) (metav1.Object, error) {
	if m, ok := o.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("not an object: %T", o)
}

func diffStates(want, got map[string]string) string {
	var d []string
	for k, v := range want {
		if got[k] != v {
			d = append(d, fmt.Sprintf("%s: want rv %s, got %q", k, v, got[k]))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("%s: unexpected (rv %s)", k, got[k]))
		}
	}
	sort.Strings(d)
	if len(d) > 10 {
		d = append(d[:10], fmt.Sprintf("... %d more", len(d)-10))
	}
	return strings.Join(d, "\n")
}

// waitSame polls until every store equals the apiserver's state.
func waitSame(t *testing.T, ctx context.Context, stores map[string]cache.Store) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		want := truth(t, ctx)
		bad := ""
		for name, s := range stores {
			if d := diffStates(want, storeState(s)); d != "" {
				bad += name + ":\n" + d + "\n"
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("informer stores differ from the apiserver:\n%s", bad)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestInformers: typed, dynamic and metadata informers against the tier,
// with the WatchListClient feature on and off, stay identical to the
// apiserver through random changes.
func TestInformers(t *testing.T) { forEachTier(t, testInformers) }

func testInformers(t *testing.T) {
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("WatchListClient=%v", watchList), func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, watchList)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := rest.CopyConfig(env.TierAdmin)
			cfg.QPS, cfg.Burst = 100, 200
			typed := informers.NewSharedInformerFactory(kc(t, cfg), 0)
			cmInformer := typed.Core().V1().ConfigMaps()
			lister := cmInformer.Lister()
			typedInf := cmInformer.Informer()
			dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(cfg), 0)
			dynInf := dyn.ForResource(cmGVR).Informer()
			meta := metadatainformer.NewSharedInformerFactory(metadata.NewForConfigOrDie(cfg), 0)
			metaInf := meta.ForResource(cmGVR).Informer()
			typed.Start(ctx.Done())
			dyn.Start(ctx.Done())
			meta.Start(ctx.Done())
			for name, inf := range map[string]cache.SharedIndexInformer{"typed": typedInf, "dynamic": dynInf, "metadata": metaInf} {
				if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
					t.Fatalf("%s informer did not sync", name)
				}
			}
			stores := map[string]cache.Store{"typed": typedInf.GetStore(), "dynamic": dynInf.GetStore(), "metadata": metaInf.GetStore()}
			waitSame(t, ctx, stores)
			churn(t, ctx, opsCount(), fmt.Sprintf("inf%v", watchList))
			waitSame(t, ctx, stores)
			// The lister reads the same store.
			all, err := lister.List(labelsEverything())
			if err != nil || len(all) != len(truth(t, ctx)) {
				t.Fatalf("lister: %d items, %v", len(all), err)
			}
			cancel()
			typed.Shutdown()
			dyn.Shutdown()
			meta.Shutdown()
		})
	}
}

// TestTierRestart: informers re-sync after the tier restarts mid-stream.
func TestTierRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inf, counts := countingInformer(t, ctx, env.TierAdmin)
	churn(t, ctx, 200, "restart")
	if err := env.RestartTier(context.Background()); err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, 200, "restart")
	waitSame(t, ctx, map[string]cache.Store{"typed": inf.GetStore()})
	checkAddsMinusDeletes(t, counts(), truth(t, ctx))
}

// countingInformer starts a configmap informer on cfg that counts adds
// minus deletes per key (countAddsMinusDeletes), waits for it to sync, and
// stops it when the test ends.
func countingInformer(t *testing.T, ctx context.Context, cfg *rest.Config) (cache.SharedIndexInformer, func() map[string]int) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	f := informers.NewSharedInformerFactory(kc(t, rest.CopyConfig(cfg)), 0)
	inf := f.Core().V1().ConfigMaps().Informer()
	counts := countAddsMinusDeletes(inf)
	f.Start(ctx.Done())
	// Stop the informer before waiting for it: Shutdown waits for its
	// goroutines, which end with ctx.
	t.Cleanup(func() { cancel(); f.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("not synced")
	}
	return inf, counts
}

// countAddsMinusDeletes counts, per key, the informer's adds minus its
// deletes; the returned function snapshots the counts.
func countAddsMinusDeletes(inf cache.SharedIndexInformer) func() map[string]int {
	var mu sync.Mutex
	counts := map[string]int{}
	bump := func(o any, by int) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		m, _ := metaOf(o)
		mu.Lock()
		counts[m.GetNamespace()+"/"+m.GetName()] += by
		mu.Unlock()
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { bump(o, 1) },
		DeleteFunc: func(o any) { bump(o, -1) },
	})
	return func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(counts)
	}
}

// checkAddsMinusDeletes: every present object was added once more than
// deleted — no duplicate adds, no missed deletes.
func checkAddsMinusDeletes(t *testing.T, counts map[string]int, want map[string]string) {
	t.Helper()
	for k, n := range counts {
		_, present := want[k]
		if (present && n != 1) || (!present && n != 0) {
			t.Errorf("%s: adds-deletes = %d, present %v", k, n, present)
		}
	}
}

// TestControllerRuntimeCache: a controller-runtime cache backed by the tier.
func TestControllerRuntimeCache(t *testing.T) { forEachTier(t, testControllerRuntimeCache) }

func testControllerRuntimeCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scheme := runtime.NewScheme()
	_ = corev1.AddToScheme(scheme)
	c, err := crcache.New(env.TierAdmin, crcache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("controller-runtime cache did not start")
	}
	cl, err := crclient.New(env.TierAdmin, crclient.Options{Scheme: scheme, Cache: &crclient.CacheOptions{Reader: c}})
	if err != nil {
		t.Fatal(err)
	}
	var list corev1.ConfigMapList
	if err := cl.List(ctx, &list, crclient.InNamespace(nsName(1))); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, crclient.ObjectKey{Namespace: nsName(1), Name: "seed-00"}, &cm); err != nil {
		t.Fatal(err)
	}
	api, err := kc(t, env.Admin).CoreV1().ConfigMaps(nsName(1)).Get(ctx, "seed-00", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.ResourceVersion != api.ResourceVersion || len(list.Items) == 0 {
		t.Fatalf("controller-runtime: rv %s vs %s, %d items", cm.ResourceVersion, api.ResourceVersion, len(list.Items))
	}
	// A change arrives through the tier's watch.
	created, err := kc(t, env.Admin).CoreV1().ConfigMaps(nsName(1)).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "crc"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer kc(t, env.Admin).CoreV1().ConfigMaps(nsName(1)).Delete(context.Background(), "crc", metav1.DeleteOptions{})
	for {
		var got corev1.ConfigMap
		if err := cl.Get(ctx, crclient.ObjectKey{Namespace: nsName(1), Name: "crc"}, &got); err == nil && got.ResourceVersion == created.ResourceVersion {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("controller-runtime cache never saw the new object")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKubectlWatch: kubectl get -w and --output-watch-events against the tier.
func TestKubectlWatch(t *testing.T) { forEachTier(t, testKubectlWatch) }

func testKubectlWatch(t *testing.T) {
	ns := nsName(2)
	for _, extra := range [][]string{nil, {"--output-watch-events"}} {
		t.Run(strings.Join(append([]string{"get-w"}, extra...), " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string{"--kubeconfig", env.TierKubeconfig, "get", "configmaps", "-n", ns, "-w"}, extra...)
			cmd := exec.CommandContext(ctx, env.CP.Kubectl(), args...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cancel(); _ = cmd.Wait() }()
			lines := make(chan string, 1000)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
			waitLine := func(pred func(string) bool) string {
				for {
					select {
					case l, ok := <-lines:
						if !ok {
							t.Fatalf("kubectl ended; stderr: %s", stderr.String())
						}
						if pred(l) {
							return l
						}
					case <-ctx.Done():
						t.Fatalf("timed out; stderr: %s", stderr.String())
					}
				}
			}
			waitLine(func(l string) bool { return strings.Contains(l, "seed-19") })
			name := fmt.Sprintf("kubectl-%d", rand.IntN(1e6))
			api := kc(t, env.Admin).CoreV1().ConfigMaps(ns)
			if _, err := api.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			l := waitLine(func(l string) bool { return strings.Contains(l, name) })
			if extra != nil && !strings.HasPrefix(l, "ADDED") {
				t.Errorf("want ADDED, got %q", l)
			}
			if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if extra != nil {
				waitLine(func(l string) bool { return strings.HasPrefix(l, "DELETED") && strings.Contains(l, name) })
			}
		})
	}
}

func labelsEverything() labels.Selector { return labels.Everything() }

// TestShardRestart: a fleet shard restarts mid-stream with an empty cache.
// The front cannot resume the shard's change stream (the new shard has no
// history before its restart), so it closes its watchers; informers
// re-watch or relist through the front and end identical to the apiserver,
// with every present object added exactly once more than deleted.
func TestShardRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restartsBefore := fleetRestarts(t, "watch-shard-1")
	inf, counts := countingInformer(t, ctx, fleet.TierAdmin)
	churn(t, ctx, 200, "shardrestart")
	// Changes while the whole shard is down: the restarted shard starts
	// after them, so the front's watermark for it is older than anything
	// the new shard can resume from.
	if err := standalone.RestartShard(1, func() { churn(t, ctx, 100, "shardrestart") }); err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, 200, "shardrestart")
	waitSame(t, ctx, map[string]cache.Store{"typed": inf.GetStore()})
	checkAddsMinusDeletes(t, counts(), truth(t, ctx))
	if after := fleetRestarts(t, "watch-shard-1"); after <= restartsBefore {
		t.Errorf("cachetier_fleet_stream_restarts_total{reason=\"expired\"} for configmaps did not move (%v -> %v): the front did not notice the shard's restart", restartsBefore, after)
	}
}

// fleetRestarts is the front's count of configmap change streams that had
// to start over because the shard lost its history.
func fleetRestarts(t *testing.T, shard string) float64 {
	return fleetStreamRestarts(t, shard, "expired")
}

// fleetStreamRestarts is the front's count of configmap change streams
// from the shard that ended for the reason (error: reopened where they
// were, possibly on another replica; expired: started over).
func fleetStreamRestarts(t *testing.T, shard, reason string) float64 {
	t.Helper()
	v, err := fleet.Metric(`cachetier_fleet_stream_restarts_total{reason="` + reason + `",resource="configmaps",shard="` + shard + `"}`)
	if err != nil {
		t.Fatal(err)
	}
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestShardReplicaLoss: one replica of a shard goes away mid-stream (its
// pod was deleted). The front fails over to the other replica for reads
// and resumes the shard's change stream there from its watermark — no
// reset, no watcher closed: informers stay identical to the apiserver,
// without a duplicate or a missed object, and consistent LISTs keep
// answering.
func TestShardReplicaLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	expiredBefore := fleetRestarts(t, "watch-shard-0")
	reopenedBefore := fleetStreamRestarts(t, "watch-shard-0", "error")
	inf, counts := countingInformer(t, ctx, fleet.TierAdmin)
	// Each replica of shard 0 in turn: whichever one the front's change
	// stream was reading from, one of the two losses moves it over.
	for _, r := range []int{0, 1} {
		churn(t, ctx, 100, "replicaloss")
		standalone.StopShardReplica(0, r)
		churn(t, ctx, 100, "replicaloss")
		waitSame(t, ctx, map[string]cache.Store{"typed": inf.GetStore()})
		want := truth(t, ctx)
		checkAddsMinusDeletes(t, counts(), want)
		for i := range 5 {
			l, err := kc(t, fleet.TierAdmin).CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("consistent LIST %d with replica %d gone: %v", i, r, err)
			}
			if len(l.Items) != len(want) {
				t.Fatalf("consistent LIST %d with replica %d gone: %d items, the apiserver has %d", i, r, len(l.Items), len(want))
			}
		}
		// Back, with an empty cache and its history starting now.
		if err := standalone.StartShardReplica(0, r); err != nil {
			t.Fatal(err)
		}
	}
	if after := fleetStreamRestarts(t, "watch-shard-0", "error"); after <= reopenedBefore {
		t.Errorf("the front's change stream from shard 0 was never reopened (%v -> %v): no failover was exercised", reopenedBefore, after)
	}
	if after := fleetRestarts(t, "watch-shard-0"); after != expiredBefore {
		t.Errorf("the front reset its watchers (expired restarts %v -> %v) although a replica with the history was up", expiredBefore, after)
	}
}

// TestShardCountChangeNeverServesAnotherRange: when the shard count
// changes, a shard's replicas roll one at a time onto a new range of hash
// shards while fronts of the old topology still serve (and new fronts start
// before every shard rolled). Here shard 1 (hash shards 2-3 of 4) rolls
// onto 2-2, as a change from 2 to 3 shards does, under a front that keeps
// its topology. While one replica still holds 2-3 the front reads only
// from it: every consistent LIST is complete, informers miss nothing. Once
// none does, reads fail with 503 instead of answering without hash shard
// 3's objects, and the front's watchers get nothing they should not. When
// the range is back, informers end identical to the apiserver, every
// present object added exactly once more than deleted. (Before, the front
// merged the rolled replica's narrower stream and lists as if complete: its
// watchers silently lost hash shard 3's changes for good.)
func TestShardCountChangeNeverServesAnotherRange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	inf, counts := countingInformer(t, ctx, fleet.TierAdmin)
	tier := kc(t, fleet.TierAdmin)
	churn(t, ctx, 100, "rerange")
	if err := standalone.RerangeShardReplica(1, 0, 2, 2); err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, 100, "rerange")
	waitSame(t, ctx, map[string]cache.Store{"typed": inf.GetStore()})
	want := truth(t, ctx)
	checkAddsMinusDeletes(t, counts(), want)
	for i := range 6 { // the front rotates the replica it reads first
		l, err := tier.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("consistent LIST %d with one replica of shard 1 on hash shards 2-2: %v", i, err)
		}
		if len(l.Items) != len(want) {
			t.Fatalf("consistent LIST %d with one replica of shard 1 on hash shards 2-2: %d items, the apiserver has %d", i, len(l.Items), len(want))
		}
	}

	misdirectedBefore := fleetShardCalls(t, "watch-shard-1", "misdirected")
	if err := standalone.RerangeShardReplica(1, 1, 2, 2); err != nil {
		t.Fatal(err)
	}
	churn(t, ctx, 50, "rerange")
	for _, rv := range []string{"", "0"} {
		err := tier.CoreV1().RESTClient().Get().Resource("configmaps").Param("resourceVersion", rv).MaxRetries(0).Do(ctx).Error()
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "holds hash shards 2-2/4, not 2-3/4") {
			t.Fatalf("LIST (resourceVersion=%q) with no replica of shard 1 on hash shards 2-3: %v, want a 503 naming both ranges", rv, err)
		}
	}
	if after := fleetShardCalls(t, "watch-shard-1", "misdirected"); after <= misdirectedBefore {
		t.Errorf("cachetier_fleet_shard_calls_total{outcome=\"misdirected\"} did not move (%v -> %v)", misdirectedBefore, after)
	}

	for r := range 2 {
		if err := standalone.RerangeShardReplica(1, r, 2, 3); err != nil {
			t.Fatal(err)
		}
	}
	churn(t, ctx, 100, "rerange")
	waitSame(t, ctx, map[string]cache.Store{"typed": inf.GetStore()})
	checkAddsMinusDeletes(t, counts(), truth(t, ctx))
}

// fleetShardCalls is the front's count of calls to shard with outcome.
func fleetShardCalls(t *testing.T, shard, outcome string) float64 {
	t.Helper()
	series, err := fleet.Series("cachetier_fleet_shard_calls_total")
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for s, v := range series {
		if strings.Contains(s, `shard="`+shard+`"`) && strings.Contains(s, `outcome="`+outcome+`"`) {
			sum += v
		}
	}
	return sum
}

// TestFleetConsistentReadOfAQuietResource: a consistent LIST of a resource
// that did not change while another one did needs every shard to prove its
// progress to the apiserver, and the front to see that proof on the change
// stream it reads — from whichever replica of each shard that stream
// comes. With two replicas per shard, asking the other replica to prove
// progress made these reads time out.
func TestFleetConsistentReadOfAQuietResource(t *testing.T) {
	ctx := context.Background()
	api, tier := kc(t, env.Admin), kc(t, fleet.TierAdmin)
	for i := range 8 {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("quiet-%d", i), Namespace: nsName(0)}}
		if _, err := api.CoreV1().ConfigMaps(nsName(0)).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		l, err := tier.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("consistent LIST of namespaces %d (%s): %v", i, time.Since(start).Round(time.Millisecond), err)
		}
		if len(l.Items) < namespaces {
			t.Fatalf("LIST %d: %d namespaces", i, len(l.Items))
		}
	}
}

package upstream

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/validation/path"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/hack/controlplane"
)

// The RV fetch must name one key the apiserver can look up: a namespaced
// path and a name that is a valid path segment (else the apiserver walks
// the whole resource), which no object of a DNS-named resource can have.
func TestRVFetchAddressesOneKey(t *testing.T) {
	if msgs := path.IsValidPathSegmentName(rvFetchName); len(msgs) > 0 {
		t.Errorf("%q is not a valid path segment (the apiserver would list the whole resource): %v", rvFetchName, msgs)
	}
	if len(validation.IsDNS1123Subdomain(rvFetchName)) == 0 {
		t.Errorf("%q is a valid DNS subdomain: a client could create an object with that name", rvFetchName)
	}
	if msgs := validation.IsDNS1123Label(rvFetchNamespace); len(msgs) > 0 {
		t.Errorf("namespace %q: %v", rvFetchNamespace, msgs)
	}
	for _, tt := range []struct {
		res  Resource
		want string
	}{
		{Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespaced: true}, "/api/v1/namespaces/cachetier-rv-fetch/configmaps"},
		{Resource{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespaced: true}, "/apis/apps/v1/namespaces/cachetier-rv-fetch/deployments"},
		{Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}}, "/api/v1/namespaces"},
		{Resource{GVR: schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}}, "/apis/rbac.authorization.k8s.io/v1/clusterroles"},
	} {
		if got := rvFetchPath(tt.res); got != tt.want {
			t.Errorf("rvFetchPath(%s) = %q, want %q", tt.res, got, tt.want)
		}
	}
	for _, q := range []string{rvFetchWatchQuery().Encode(), rvFetchListQuery().Encode()} {
		if !strings.Contains(q, "fieldSelector=metadata.name%3Dcachetier%3Arv-fetch") {
			t.Errorf("query %q does not select the one name", q)
		}
		if strings.Contains(q, "limit=") {
			t.Errorf("query %q: a limit makes a LIST walk the collection", q)
		}
	}
}

// Against a real kube-apiserver (skipped without bin/k8s): the RV fetch is
// at least the revision of a write to another resource made just before
// (safe for consistent reads), by watch-list and by LIST, for a namespaced
// and a cluster-scoped resource; no ConfigMap can take the fetch's name;
// and consistent waits on a quiet resource complete through progress
// probes while another resource changes.
func TestRealAPIServer(t *testing.T) {
	if _, err := controlplane.FindBinDir(); err != nil {
		t.Skip(err)
	}
	cp := controlplane.StartForTest(t, controlplane.Options{})
	cfg, err := cp.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	kc := kubernetes.NewForConfigOrDie(cfg)
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	configMaps := Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true}
	namespaces := Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Kind: "Namespace"}
	newIngester := func(res Resource) (*Ingester, *metrics.Metrics) {
		st, err := store.New(store.Options{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		m := metrics.New(prometheus.NewRegistry())
		return New(Options{Resource: res, Host: cfg.Host, Client: client, Store: st, Metrics: m, Log: logr.Discard()}), m
	}
	lw := newLeaseWriter(t, kc)

	t.Run("rv fetch", func(t *testing.T) {
		for _, res := range []Resource{configMaps, namespaces} {
			for _, byList := range []bool{false, true} {
				in, _ := newIngester(res)
				in.rvFetchByList.Store(byList)
				written := lw.renew(ctx)
				rv, err := in.CurrentRV(ctx)
				if err != nil {
					t.Fatalf("%s (by LIST: %v): %v", res, byList, err)
				}
				if rv < written {
					t.Errorf("%s (by LIST: %v): fetched RV %d is older than a write acknowledged before the fetch (%d)", res, byList, rv, written)
				}
			}
		}
	})

	// The apiserver gzips a watch-list for a client that accepts it (Go's
	// transport does by default: the control); the tier's watches ask it
	// not to.
	t.Run("watches are not compressed", func(t *testing.T) {
		u := cfg.Host + configMaps.Path()
		q := url.Values{"watch": {"1"}, "sendInitialEvents": {"true"}, "allowWatchBookmarks": {"true"},
			"resourceVersionMatch": {"NotOlderThan"}, "timeoutSeconds": {"1"}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"?"+q.Encode(), nil)
		if err != nil {
			t.Fatal(err)
		}
		control, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		control.Body.Close()
		if !control.Uncompressed {
			t.Fatalf("control: a watch-list with Go's default Accept-Encoding came back uncompressed (%v); the test proves nothing", control.Header)
		}
		resp, err := get(ctx, client, u, configMaps, q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.Uncompressed || resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("the tier's watch-list came back compressed: uncompressed by the transport %v, Content-Encoding %q", resp.Uncompressed, resp.Header.Get("Content-Encoding"))
		}
		s := newEventStream(resp.Body, shortStreamBuffer)
		if ev, err := s.next(); err != nil || ev.Type != "BOOKMARK" && ev.Type != "ADDED" {
			t.Errorf("first event of the uncompressed watch-list: %+v, %v", ev.Type, err)
		}
	})

	t.Run("no object can have the fetch's name", func(t *testing.T) {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rvFetchNamespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := kc.CoreV1().ConfigMaps(rvFetchNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: rvFetchName}}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Fatalf("creating ConfigMap %q: %v, want Invalid", rvFetchName, err)
		}
	})

	t.Run("quiet resource, busy cluster", func(t *testing.T) {
		in, m := newIngester(configMaps)
		in.prober.linger = time.Second
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); in.Run(runCtx) }()
		defer func() { stop(); <-done }()
		select {
		case <-in.Synced():
		case <-ctx.Done():
			t.Fatal("not synced")
		}
		for i := range 5 {
			written := lw.renew(ctx) // the cluster moves; configmaps do not
			rv, err := in.CurrentRV(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rv < written {
				t.Fatalf("read %d: RV %d < %d", i, rv, written)
			}
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			err = in.WaitFresh(wctx, rv)
			wcancel()
			if err != nil {
				t.Fatalf("read %d: wait for RV %d (applied %d): %v", i, rv, in.AppliedRV(), err)
			}
		}
		if n := testutil.ToFloat64(m.ProgressProbes.WithLabelValues(in.res, probeBookmark)); n < 1 {
			t.Errorf("%v probes ended with a bookmark; the waits were proven otherwise?", n)
		}
		// The probes stop once no read wants them (linger 1 s here).
		deadline := time.Now().Add(15 * time.Second)
		for in.probing() {
			if time.Now().After(deadline) {
				t.Fatal("the prober still runs long after the last read")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// leaseWriter moves the cluster's RV by renewing a Lease.
type leaseWriter struct {
	t     *testing.T
	kc    kubernetes.Interface
	mu    sync.Mutex
	lease *coordinationv1.Lease
}

func newLeaseWriter(t *testing.T, kc kubernetes.Interface) *leaseWriter {
	holder := "upstream-test"
	l, err := kc.CoordinationV1().Leases("default").Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "upstream-test"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &leaseWriter{t: t, kc: kc, lease: l}
}

// renew updates the Lease and returns the RV the apiserver acknowledged.
func (w *leaseWriter) renew(ctx context.Context) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	l, err := w.kc.CoordinationV1().Leases("default").Update(ctx, w.lease, metav1.UpdateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.lease = l
	rv, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	if err != nil {
		w.t.Fatal(err)
	}
	return rv
}

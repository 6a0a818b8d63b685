package fleet

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ReplicaAddresses maps the stable names of a fleet's shard replicas
// (<pod>.<service>.<namespace>.svc, as the topology names them) to their
// pods' current addresses, read from the EndpointSlices of the shards'
// headless Service.
//
// Why not DNS: cluster DNS answers from a cache (kubeadm's CoreDNS: ttl 30,
// cache 30), so for up to 30 s after a replica is replaced — a drain, a
// lost node — its name still gives the old pod's address; a drain that
// replaces both replicas of a shard within that time left the shard
// unreachable from the fronts while both pods were Ready (met on three
// nodes). And a CoreDNS that died with its node makes a share of lookups
// time out until its endpoint is removed. The EndpointSlices change as the
// pods do, about a second later, and the front already talks to the
// apiserver. A name the slices do not (yet) have is looked up in DNS.
type ReplicaAddresses struct {
	domain string // ".<service>.<namespace>.svc"
	log    logr.Logger

	mu     sync.RWMutex
	byName map[string]string // pod hostname → address
}

// WatchReplicaAddresses watches the EndpointSlices of service in namespace
// until ctx ends.
func WatchReplicaAddresses(ctx context.Context, kc kubernetes.Interface, namespace, service string, log logr.Logger) *ReplicaAddresses {
	a := &ReplicaAddresses{domain: "." + service + "." + namespace + ".svc", log: log, byName: map[string]string{}}
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + service }))
	inf := f.Discovery().V1().EndpointSlices().Informer()
	update := func(any) { a.set(inf.GetStore()) }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: update, UpdateFunc: func(_, n any) { update(n) }, DeleteFunc: update,
	})
	f.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		f.Shutdown()
	}()
	return a
}

func (a *ReplicaAddresses) set(store cache.Store) {
	var slices []*discoveryv1.EndpointSlice
	for _, o := range store.List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
	m := replicaAddresses(slices)
	a.mu.Lock()
	changed := !equalMaps(a.byName, m)
	a.byName = m
	a.mu.Unlock()
	if changed {
		a.log.Info("shard replica addresses", "replicas", describe(m))
	}
}

// Lookup returns the current address of the replica called host, if the
// EndpointSlices have it.
func (a *ReplicaAddresses) Lookup(host string) (string, bool) {
	pod, ok := strings.CutSuffix(host, a.domain)
	if !ok || pod == "" || strings.Contains(pod, ".") {
		return "", false
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	addr, ok := a.byName[pod]
	return addr, ok
}

// replicaAddresses maps each endpoint's hostname (a StatefulSet pod's
// name, set for the pods of the Service named by their subdomain) to its
// first address. An endpoint that is terminating yields to one that is not
// (a pod replaced under the same name is only created once the old one is
// gone, but slices are updated one at a time).
func replicaAddresses(slices []*discoveryv1.EndpointSlice) map[string]string {
	out := map[string]string{}
	terminating := map[string]bool{}
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Hostname == nil || *ep.Hostname == "" || len(ep.Addresses) == 0 {
				continue
			}
			term := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			name := *ep.Hostname
			if _, seen := out[name]; seen && (term || !terminating[name]) {
				continue
			}
			out[name], terminating[name] = ep.Addresses[0], term
		}
	}
	return out
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func describe(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

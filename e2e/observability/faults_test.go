package observability

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/controllers"
	"github.com/cachetier/cachetier/hack/cluster"
	"github.com/cachetier/cachetier/hack/nodeinstall"
	"github.com/cachetier/cachetier/hack/promapi"
	"github.com/cachetier/cachetier/internal/alerts"
)

// operatorFaults are what only a stopped operator lets last: the fleet's
// RBAC revoked and a serving certificate about to expire (a running
// operator restores the binding and renews the certificate within
// seconds, which is what the alerts exist to catch when it does not).
type operatorFaults struct {
	e        *env
	p        *cachev1alpha1.CacheProfile
	replicas int32
	binding  string
	started  time.Time
}

// breakWhileOperatorStopped scales the manager to zero, deletes the
// fleet's ClusterRoleBinding (every call the fleet makes to the apiserver
// is refused: RV fetches, TokenReviews, SubjectAccessReviews) and replaces
// its serving certificate with one that expires in 10 days. Then
// CachetierUpstreamAuthErrors (after its 5 min `for:`) and
// CachetierCertificateExpiringSoon fire.
func (e *env) breakWhileOperatorStopped(t *testing.T, p *cachev1alpha1.CacheProfile) *operatorFaults {
	ctx := context.Background()
	kc := e.in.Client
	f := &operatorFaults{e: e, p: p}
	mgr, err := kc.AppsV1().Deployments(ns).Get(ctx, nodeinstall.ManagerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.replicas = *mgr.Spec.Replicas
	e.scaleManager(t, 0)
	opts := controllers.Options{Namespace: ns}
	f.binding = controllers.BuildClusterRoleBinding(p, opts).Name
	if err := kc.RbacV1().ClusterRoleBindings().Delete(ctx, f.binding, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.shortLivedServingCert(t, p, opts)
	f.started = time.Now()
	t.Logf("manager scaled to 0, ClusterRoleBinding %s deleted, serving certificate replaced by one expiring in 10 days", f.binding)

	certMatch := func(a promapi.Alert) bool {
		return a.Labels["alertname"] == alerts.CertificateExpiringSoon && a.Labels["namespace"] == ns
	}
	cert := e.waitAlert(t, "firing", 5*time.Minute, certMatch)
	t.Logf("%s firing %s after the certificate was replaced: %v, %q", alerts.CertificateExpiringSoon, time.Since(f.started).Round(time.Second), cert.Labels, cert.Annotations["description"])
	authMatch := func(a promapi.Alert) bool { return a.Labels["alertname"] == alerts.UpstreamAuthErrors }
	auth := e.waitAlert(t, "firing", 9*time.Minute, authMatch)
	t.Logf("%s firing %s after the binding was deleted: %v, %q", alerts.UpstreamAuthErrors, time.Since(f.started).Round(time.Second), auth.Labels, auth.Annotations["description"])
	if auth.Labels["code"] != "403" || auth.Labels["severity"] != "critical" {
		t.Errorf("%s labels %v: want code 403, severity critical", alerts.UpstreamAuthErrors, auth.Labels)
	}
	return f
}

// restore scales the manager back: it recreates the binding and renews
// the certificate.
func (f *operatorFaults) restore(t *testing.T) {
	ctx := context.Background()
	f.e.scaleManager(t, f.replicas)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := f.e.in.Client.RbacV1().ClusterRoleBindings().Get(ctx, f.binding, metav1.GetOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			t.Fatalf("the restarted operator did not recreate ClusterRoleBinding %s: %v", f.binding, err)
		}
		time.Sleep(time.Second)
	}
	f.started = time.Now()
	t.Logf("manager back to %d replicas; ClusterRoleBinding %s recreated", f.replicas, f.binding)
}

// waitResolved waits until both alerts are gone: the certificate renewed
// and mounted, and no 403 in the auth alert's 5 min rate window.
func (f *operatorFaults) waitResolved(t *testing.T) {
	for _, name := range []string{alerts.CertificateExpiringSoon, alerts.UpstreamAuthErrors} {
		f.e.waitAlert(t, "", 9*time.Minute, func(a promapi.Alert) bool { return a.Labels["alertname"] == name })
		t.Logf("%s resolved within %s after the operator came back", name, time.Since(f.started).Round(time.Second))
	}
}

// scaleManager sets the manager Deployment's replicas and waits for that
// many Ready pods (or none left).
func (e *env) scaleManager(t *testing.T, replicas int32) {
	t.Helper()
	ctx := context.Background()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := e.in.Client.AppsV1().Deployments(ns).Patch(ctx, nodeinstall.ManagerDeployment, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if replicas > 0 {
		if err := e.in.Cluster.WaitPodsReady(ctx, ns, nodeinstall.ManagerSelector, int(replicas), 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		return
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := e.in.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: nodeinstall.ManagerSelector})
		if err == nil && len(pods.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("manager pods still there 2 min after scaling to 0 (err %v)", err)
		}
		time.Sleep(time.Second)
	}
}

// shortLivedServingCert replaces the fleet's serving certificate with one
// signed by the fleet's CA for the same names, issued 60 days ago and
// expiring in 10: valid (the fleet keeps serving, the aggregator keeps
// trusting it), inside the alert's 20 days, and inside the operator's
// renewal window, so a running operator replaces it.
func (e *env) shortLivedServingCert(t *testing.T, p *cachev1alpha1.CacheProfile, opts controllers.Options) {
	ctx := context.Background()
	secrets := e.in.Client.CoreV1().Secrets(ns)
	caSecret, err := secrets.Get(ctx, controllers.BuildCASecret(p, opts, controllers.Certificates{}).Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	servingName := controllers.BuildServingSecret(p, opts, controllers.Certificates{}).Name
	serving, err := secrets.Get(ctx, servingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := parsePEMCert(t, caSecret.Data["ca.crt"])
	caKey := parsePEMKey(t, caSecret.Data["ca.key"])
	old := parsePEMCert(t, serving.Data["tls.crt"])
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      old.Subject,
		DNSNames:     old.DNSNames,
		NotBefore:    now.Add(-60 * 24 * time.Hour),
		NotAfter:     now.Add(10 * 24 * time.Hour),
		KeyUsage:     old.KeyUsage,
		ExtKeyUsage:  old.ExtKeyUsage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	serving.Data["tls.crt"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	serving.Data["tls.key"] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if _, err := secrets.Update(ctx, serving, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func parsePEMCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("no PEM certificate in %q", b)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func parsePEMKey(t *testing.T, b []byte) any {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("no PEM key")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		return k
	}
	k, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// apiserverCut is the fleet's shards cut off the apiserver while the
// fronts, the aggregator and the operator keep it.
type apiserverCut struct {
	e       *env
	unblock func(context.Context) error
	cut     time.Time
	lifted  time.Time
}

// cutShardsOffAPIServer drops, in the node's network, everything the
// profile's shard pods send to the apiserver: their watches go silent and
// no shard can read the apiserver's current resourceVersion, so the
// fronts answer consistent reads with 504 ResourceVersionTooLarge (never
// the cached data) and CachetierFreshnessTimeouts fires after its 5 min
// `for:`. Then the cut is lifted.
func (e *env) cutShardsOffAPIServer(t *testing.T, p *cachev1alpha1.CacheProfile) *apiserverCut {
	ctx := context.Background()
	pods, err := e.in.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: controllers.LabelProfile + "=" + p.Name + "," + controllers.LabelComponent + "=" + controllers.ComponentShard})
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for _, pod := range pods.Items {
		if pod.Status.PodIP == "" || pod.Spec.NodeName != cluster.NodeName {
			t.Fatalf("shard pod %s: IP %q on node %q", pod.Name, pod.Status.PodIP, pod.Spec.NodeName)
		}
		ips = append(ips, pod.Status.PodIP)
	}
	if want := int(p.Spec.Shards * p.Spec.ReplicasPerShard); len(ips) != want {
		t.Fatalf("%d shard pods, want %d", len(ips), want)
	}
	c := &apiserverCut{e: e}
	if c.unblock, err = e.in.Cluster.BlockAPIServer(ctx, cluster.NodeName, ips); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.lift(t) })
	c.cut = time.Now()
	t.Logf("shard pods %v cut off the apiserver", ips)
	match := func(a promapi.Alert) bool {
		return a.Labels["alertname"] == alerts.FreshnessTimeouts && a.Labels["namespace"] == ns
	}
	firing := e.waitAlert(t, "firing", 9*time.Minute, match)
	t.Logf("%s firing %s after the cut: %v, %q", alerts.FreshnessTimeouts, time.Since(c.cut).Round(time.Second), firing.Labels, firing.Annotations["description"])
	if firing.Labels["severity"] != "warning" || firing.Labels["job"] != p.Name+"-front" {
		t.Errorf("%s labels %v: want severity warning, job %s-front", alerts.FreshnessTimeouts, firing.Labels, p.Name)
	}
	c.lift(t)
	return c
}

// lift gives the shards the apiserver back (once).
func (c *apiserverCut) lift(t *testing.T) {
	if c.unblock == nil {
		return
	}
	if err := c.unblock(context.Background()); err != nil {
		t.Error(err)
	}
	c.unblock = nil
	c.lifted = time.Now()
}

// waitResolved waits until no consistent read has timed out for the
// alert's 5 min window: the shards caught up with the apiserver by
// themselves.
func (c *apiserverCut) waitResolved(t *testing.T) {
	// Where the 504s came from, minute by minute since the cut (which
	// phase: the cut, the shard kill that ran since, or neither), and
	// what the freshness waits and the shards' proofs of progress did:
	// read when the alert lasts, logged either way.
	defer c.e.logFreshness(t, c.cut)
	c.e.waitAlert(t, "", 9*time.Minute, func(a promapi.Alert) bool { return a.Labels["alertname"] == alerts.FreshnessTimeouts })
	t.Logf("%s resolved within %s after the shards reached the apiserver again", alerts.FreshnessTimeouts, time.Since(c.lifted).Round(time.Second))
}

// logFreshness logs, from Prometheus, the fronts' 504s per resource and
// minute since `since`, and over the last 5 min: the fronts' 504s per
// pod, the freshness waits' p99 per job and resource, and the shards'
// RV fetches and progress probes by outcome.
func (e *env) logFreshness(t *testing.T, since time.Time) {
	ctx := context.Background()
	front := fmt.Sprintf(`namespace=%q,job=~".*-front"`, ns)
	perMinute := fmt.Sprintf(`sum by (resource) (increase(cachetier_requests_total{%s,code="504"}[1m]))`, front)
	if series, err := e.prom.QueryRange(ctx, perMinute, since, time.Now(), time.Minute); err != nil {
		t.Logf("504s per minute: %v", err)
	} else {
		for _, s := range series {
			counts := make([]string, len(s.Values))
			for i, v := range s.Values {
				counts[i] = strconv.FormatFloat(v, 'f', 0, 64)
			}
			t.Logf("fronts' 504s for %s per minute from %s: %s", s.Metric["resource"], since.Format(time.TimeOnly), strings.Join(counts, " "))
		}
	}
	for _, q := range []struct{ what, expr string }{
		{"fronts' requests by pod and code (5m)", fmt.Sprintf(`sum by (pod, resource, code) (increase(cachetier_requests_total{%s}[5m]))`, front)},
		{"freshness wait p99 by job and resource (5m)", fmt.Sprintf(`histogram_quantile(0.99, sum by (le, job, resource) (rate(cachetier_freshness_wait_seconds_bucket{namespace=%q}[5m])))`, ns)},
		{"freshness waits by outcome (5m)", fmt.Sprintf(`sum by (job, resource, outcome) (increase(cachetier_freshness_wait_seconds_count{namespace=%q}[5m]))`, ns)},
		{"shards' RV fetches by outcome (5m)", fmt.Sprintf(`sum by (pod, resource, outcome) (increase(cachetier_upstream_rv_fetches_total{namespace=%q}[5m]))`, ns)},
		{"shards' progress probes by outcome (5m)", fmt.Sprintf(`sum by (pod, resource, outcome) (increase(cachetier_upstream_progress_probes_total{namespace=%q}[5m]))`, ns)},
		{"fronts' shard calls that failed (5m)", fmt.Sprintf(`sum by (pod, shard, verb, outcome) (increase(cachetier_fleet_shard_calls_total{namespace=%q,outcome!="ok"}[5m]))`, ns)},
	} {
		samples, err := e.prom.Query(ctx, q.expr)
		if err != nil {
			t.Logf("%s: %v", q.what, err)
			continue
		}
		lines := make([]string, 0, len(samples))
		for _, s := range samples {
			lines = append(lines, fmt.Sprintf("%v %.3g", s.Metric, s.Value))
		}
		sort.Strings(lines)
		t.Logf("%s:\n  %s", q.what, strings.Join(lines, "\n  "))
	}
}

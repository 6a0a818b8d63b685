package authedges

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tooLargeMessage is kube-apiserver's message for a read at a
// resourceVersion its watch cache has not reached in time
// (k8s.io/apiserver/pkg/storage NewTooLargeResourceVersionError, with the
// Timeout reason's prefix).
var tooLargeMessage = regexp.MustCompile(`^Timeout: Too large resource version: (\d+), current: (\d+)$`)

// TestFreshnessUnproven holds the watches the tiers prove a consistent
// read's freshness with (upstreamGate), writes a configmap, and reads it
// through every target without a resourceVersion. The tier knows the
// apiserver is ahead (its RV fetch still works) but cannot show its cache
// has caught up, so it must answer kube-apiserver's 504 "Too large
// resource version" with Retry-After — not the data it has, which lacks
// the write, and not the apiserver's answer fetched on the client's
// behalf: the apiserver's audit log must show no LIST or GET of
// configmaps from the tiers meanwhile. Released, the tiers serve the
// write.
func TestFreshnessUnproven(t *testing.T) {
	ctx := context.Background()
	admin := credential{cert: clientCert(t, "freshness-admin", "system:masters")}
	list := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	// Every tier has answered a consistent read (and so seen bookmarks on
	// its streams) before the watches are held.
	for _, tg := range targets {
		if a := tg.send(t, admin, list); a.code != http.StatusOK {
			t.Fatalf("%s: %s", tg.name, a)
		}
	}

	held := time.Now()
	for _, g := range gates {
		g.Hold()
	}
	released := false
	release := func() {
		if !released {
			for _, g := range gates {
				g.Release()
			}
			released = true
		}
	}
	defer release()
	cm, err := kc.CoreV1().ConfigMaps(dataNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "written-while-held"}, Data: map[string]string{"secret-ish": "new"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	written, err := strconv.ParseUint(cm.ResourceVersion, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	get := list + "/" + cm.Name

	// kube-apiserver's answer to a read its watch cache cannot serve in
	// time: a resourceVersion far beyond the write.
	future := fmt.Sprintf("%s?resourceVersion=%d&resourceVersionMatch=NotOlderThan", list, written+1_000_000)
	want := apiserver.send(t, admin, future)
	t.Logf("kube-apiserver: GET %s -> %s, Retry-After %q", future, want, want.header.Get("Retry-After"))
	checkTooLarge(t, apiserver, want, written+1_000_000)

	// Concurrently: each read waits out the tier's freshness timeout.
	type result struct {
		tg   target
		path string
		got  answer
		took time.Duration
	}
	var results []*result
	var wg sync.WaitGroup
	for _, tg := range targets {
		for _, path := range []string{list, get} {
			r := &result{tg: tg, path: path}
			results = append(results, r)
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				c := tg.client(admin)
				defer c.CloseIdleConnections()
				var err error
				if r.got, err = tg.get(ctx, c, admin, path); err != nil {
					r.got = answer{code: -1, body: []byte(err.Error())}
				}
				r.took = time.Since(start)
			}()
		}
	}
	wg.Wait()
	answered := time.Now()
	for _, r := range results {
		t.Logf("%s: GET %s -> %s, Retry-After %q (%s)", r.tg.name, r.path, r.got, r.got.header.Get("Retry-After"), r.took.Round(time.Millisecond))
		current := checkTooLarge(t, r.tg, r.got, written)
		if current >= written {
			t.Errorf("%s: current %d is not behind the write at %d", r.tg.name, current, written)
		}
		if r.got.header.Get("Retry-After") != want.header.Get("Retry-After") || r.got.status.Details.RetryAfterSeconds != want.status.Details.RetryAfterSeconds {
			t.Errorf("%s: Retry-After %q / retryAfterSeconds %d; the apiserver %q / %d", r.tg.name,
				r.got.header.Get("Retry-After"), r.got.status.Details.RetryAfterSeconds, want.header.Get("Retry-After"), want.status.Details.RetryAfterSeconds)
		}
		if fmt.Sprint(r.got.status.Details.Causes) != fmt.Sprint(want.status.Details.Causes) {
			t.Errorf("%s: causes %v; the apiserver %v", r.tg.name, r.got.status.Details.Causes, want.status.Details.Causes)
		}
		noData(t, r.tg, r.got)
	}
	noFallback(t, held, answered)

	release()
	for _, tg := range targets {
		for _, path := range []string{list, get} {
			if got := tg.send(t, admin, path); got.code != http.StatusOK || !strings.Contains(string(got.body), `"resourceVersion":"`+cm.ResourceVersion+`"`) {
				t.Errorf("%s: GET %s after the release -> %s; want the write at %s", tg.name, path, got, cm.ResourceVersion)
			}
		}
	}
}

// checkTooLarge fails unless a is kube-apiserver's 504 Timeout for a read
// at least at rv: the Status, its ResourceVersionTooLarge cause, and
// Retry-After as header and detail. It returns the "current" resource
// version the message names.
func checkTooLarge(t *testing.T, tg target, a answer, rv uint64) uint64 {
	t.Helper()
	if a.code != http.StatusGatewayTimeout || a.status == nil || a.status.Reason != metav1.StatusReasonTimeout || a.status.Details == nil {
		t.Fatalf("%s answered %s; want 504 Timeout", tg.name, a)
	}
	m := tooLargeMessage.FindStringSubmatch(a.status.Message)
	if m == nil {
		t.Fatalf("%s: message %q is not the apiserver's %q", tg.name, a.status.Message, tooLargeMessage)
	}
	target, _ := strconv.ParseUint(m[1], 10, 64)
	current, _ := strconv.ParseUint(m[2], 10, 64)
	if target < rv {
		t.Errorf("%s: the read waited for %d, before the write at %d", tg.name, target, rv)
	}
	causes := a.status.Details.Causes
	if len(causes) != 1 || causes[0].Type != metav1.CauseTypeResourceVersionTooLarge {
		t.Errorf("%s: causes %v; want one %s", tg.name, causes, metav1.CauseTypeResourceVersionTooLarge)
	}
	if a.status.Details.RetryAfterSeconds < 1 || a.header.Get("Retry-After") != strconv.Itoa(int(a.status.Details.RetryAfterSeconds)) {
		t.Errorf("%s: Retry-After %q, retryAfterSeconds %d", tg.name, a.header.Get("Retry-After"), a.status.Details.RetryAfterSeconds)
	}
	return current
}

// noFallback reads the apiserver's audit log: between from and to, the
// tiers' identities must not have LISTed or GOT configmaps (a fallback
// serving the client from the apiserver). What they did send is logged.
func noFallback(t *testing.T, from, to time.Time) {
	t.Helper()
	events, err := cp.ReadAudit(from)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, ev := range events {
		if !tierUsers[ev.User.Username] || ev.RequestReceivedTimestamp.Time.After(to) {
			continue
		}
		resource, kind := "", ev.Verb+" "
		switch {
		case ev.ObjectRef == nil:
			kind += strings.SplitN(ev.RequestURI, "?", 2)[0] // a non-resource URL
		case ev.ObjectRef.Namespace != "":
			resource = ev.ObjectRef.Resource
			kind += resource + " in " + ev.ObjectRef.Namespace
		default:
			resource = ev.ObjectRef.Resource
			kind += resource
		}
		seen[kind]++
		if resource == "configmaps" && (ev.Verb == "list" || ev.Verb == "get") {
			t.Errorf("the apiserver got %s %s from %s while the tiers could not prove freshness", ev.Verb, ev.RequestURI, ev.User.Username)
		}
	}
	kinds := make([]string, 0, len(seen))
	for k, n := range seen {
		kinds = append(kinds, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("the tiers' requests to the apiserver while held (audit log, %s): %s", to.Sub(from).Round(time.Millisecond), strings.Join(kinds, "; "))
	if len(seen) == 0 {
		t.Errorf("no request of the tiers in the audit log: the log does not record them, so it proves nothing")
	}
}

package authedges

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"
)

// TestAuthorizationRenewedInUse: a client that keeps reading never waits
// for a SubjectAccessReview after its first read. The tier keeps an answer
// for authCacheTTL and renews it in the background while it is in use
// (package auth, renewal.go), so the apiserver's audit log shows a tier's
// reviews about a steady reader less than a TTL apart — with the library's
// cache alone the next review came only when a read found the answer
// expired, a TTL or more after the last, and that read waited for it.
// Certificate users read through every way in, and a ServiceAccount token
// user reads the standalone tier directly.
func TestAuthorizationRenewedInUse(t *testing.T) {
	const (
		readFor = 2*authCacheTTL + 3*time.Second
		every   = 250 * time.Millisecond
	)
	path := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	type steady struct {
		tg   target
		user string
		cred credential
	}
	var readers []steady
	for i, tg := range targets {
		user := fmt.Sprintf("steady-reader-%d", i)
		bindReader(t, user)
		readers = append(readers, steady{tg: tg, user: user, cred: credential{cert: clientCert(t, user)}})
	}
	const account = "steady-token-reader"
	newServiceAccount(t, account)
	readers = append(readers, steady{tg: targets[0], user: "system:serviceaccount:" + dataNamespace + ":" + account, cred: credential{token: requestToken(t, account, nil)}})
	start := time.Now()
	errs := make([]error, len(readers))
	var wg sync.WaitGroup
	for i, r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.tg.client(r.cred)
			defer c.CloseIdleConnections()
			for time.Since(start) < readFor {
				a, err := r.tg.get(context.Background(), c, r.cred, path)
				if err == nil && a.code != http.StatusOK {
					err = fmt.Errorf("%s", a)
				}
				if err != nil {
					errs[i] = fmt.Errorf("%s, %s: %v", r.tg.name, r.user, err)
					return
				}
				time.Sleep(every)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// When each tier asked about each reader's LIST: reader → tier → times.
	asked := map[string]map[string][]time.Time{}
	for _, r := range tierReviews(t, start) {
		if ra := r.spec.ResourceAttributes; ra == nil || ra.Verb != "list" || ra.Resource != "configmaps" {
			continue
		}
		if asked[r.spec.User] == nil {
			asked[r.spec.User] = map[string][]time.Time{}
		}
		asked[r.spec.User][r.tier] = append(asked[r.spec.User][r.tier], r.at)
	}
	for _, r := range readers {
		if len(asked[r.user]) == 0 {
			t.Errorf("the audit log has no review about %s's reads through %s", r.user, r.tg.name)
		}
		for tier, times := range asked[r.user] {
			renewedInUse(t, fmt.Sprintf("%s's SubjectAccessReviews about %s (%s)", tier, r.user, r.tg.name), times, readFor)
		}
	}
}

// renewedInUse checks the times of one question's reviews during readFor
// of steady reads: never a TTL apart, and renewed at least twice — the
// first review and one each three quarters of the TTL after (0, 7.5, 15,
// 22.5 s).
func renewedInUse(t *testing.T, what string, times []time.Time, readFor time.Duration) {
	t.Helper()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	var gaps []string
	for i := 1; i < len(times); i++ {
		gap := times[i].Sub(times[i-1])
		gaps = append(gaps, gap.Round(10*time.Millisecond).String())
		if gap >= authCacheTTL {
			t.Errorf("%s: %s apart, not renewed before the answer expired (%s)", what, gap.Round(time.Millisecond), authCacheTTL)
		}
	}
	t.Logf("%s: %d in %s of steady reads, gaps %v", what, len(times), readFor, gaps)
	if len(times) < 3 {
		t.Errorf("%s: %d in %s; want the first and at least two renewals", what, len(times), readFor)
	}
}

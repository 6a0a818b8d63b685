package authedges

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// authCacheTTL is how long the tier keeps TokenReview and
// SubjectAccessReview answers (cache-server/internal/auth: Options.CacheTTL
// defaults to 10 s, as k8s.io/apiserver's delegated authentication and
// authorization; documented in docs/differences.md).
const authCacheTTL = 10 * time.Second

// revocationMargin is what a refusal may take beyond authCacheTTL: the
// apiserver's informer seeing the change, the poll interval, and one
// request's round trip on a loaded machine.
const revocationMargin = 3 * time.Second

// pollInterval is how often each reader reads while access is revoked.
const pollInterval = 100 * time.Millisecond

// reader reads path through one target with its own credential, on one
// connection, as a client that keeps reading would.
type reader struct {
	tg   target
	cred credential
}

// revocation is what one reader saw after revoke, counted from when revoke
// returned: when it sent its last read that was served, and when the
// answer of its first refused read came.
type revocation struct {
	lastOK, refusedAt time.Duration
	refusal           answer
}

// untilRefused checks that every reader can read path, runs revoke, and
// keeps every reader reading until it is refused (or authCacheTTL plus
// revocationMargin plus a grace period have passed); it returns what each
// saw, in the order of readers. The readers read concurrently so that
// each one's time to refusal is measured from the same instant.
func untilRefused(t *testing.T, readers []reader, path string, revoke func()) []revocation {
	t.Helper()
	clients := make([]*http.Client, len(readers))
	for i, r := range readers {
		clients[i] = r.tg.client(r.cred)
		defer clients[i].CloseIdleConnections()
		// Fills every cache a reader's answer can come from.
		a, err := r.tg.get(context.Background(), clients[i], r.cred, path)
		if err != nil {
			t.Fatalf("%s: %v", r.tg.name, err)
		}
		if a.code != http.StatusOK {
			t.Fatalf("%s: %s before the revocation; want the read served", r.tg.name, a)
		}
	}
	revoke()
	revoked := time.Now()
	giveUp := revoked.Add(authCacheTTL + revocationMargin + 10*time.Second)
	out := make([]revocation, len(readers))
	errs := make([]error, len(readers))
	var wg sync.WaitGroup
	for i, r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				sent := time.Since(revoked)
				a, err := r.tg.get(context.Background(), clients[i], r.cred, path)
				switch {
				case err != nil:
					errs[i] = fmt.Errorf("%s: %v", r.tg.name, err)
					return
				case a.code == http.StatusOK:
					out[i].lastOK = sent
				default:
					// When the answer came: an upper bound of the time
					// to refusal, however slow the round trip.
					out[i].refusedAt, out[i].refusal = time.Since(revoked), a
					return
				}
				if time.Now().After(giveUp) {
					errs[i] = fmt.Errorf("%s still served a read sent %s after the revocation", r.tg.name, sent.Round(time.Millisecond))
					return
				}
				time.Sleep(pollInterval)
			}
		}()
	}
	wg.Wait()
	for i, r := range readers {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		t.Logf("%s: last served a read sent %s after the revocation, refused %s after it: %s", r.tg.name,
			out[i].lastOK.Round(time.Millisecond), out[i].refusedAt.Round(time.Millisecond), out[i].refusal)
	}
	return out
}

// refusedInTime checks that the tier's readers (all but the first, the
// apiserver) were refused within authCacheTTL plus revocationMargin, and
// refused as the apiserver refuses the same credential now.
func refusedInTime(t *testing.T, readers []reader, got []revocation, path string) {
	t.Helper()
	for i, r := range readers {
		if i == 0 {
			continue
		}
		if got[i].refusedAt > authCacheTTL+revocationMargin {
			t.Errorf("%s refused %s after the revocation; the documented bound is %s (+%s margin)",
				r.tg.name, got[i].refusedAt.Round(time.Millisecond), authCacheTTL, revocationMargin)
		}
		sameRefusal(t, r.tg, got[i].refusal, apiserver.send(t, r.cred, path))
	}
}

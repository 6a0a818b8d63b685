package authedges

import (
	"strings"
	"testing"
	"time"
)

// TestSelectorAuthorization: LISTs with field and label selectors (the
// authorization attributes since AuthorizeWithSelectors) get the
// apiserver's answers through every way into the tier, and a user allowed
// to read the collection costs no SubjectAccessReview per selector: a
// selector only narrows access, so the tier asks about the request
// without it (package auth, selectors.go), the question a read of the
// whole collection asked already. A DaemonSet's agents, one identity
// reading one node each, are that user. A node (group system:nodes) is
// asked with its selector at once, and is refused here as the apiserver
// refuses it.
//
// The selectors name no object: a LIST whose field selector is
// metadata.name=<name> is authorized as a read of that name (RequestInfo
// takes the name from the selector, in kube-apiserver too), another
// question per name.
func TestSelectorAuthorization(t *testing.T) {
	reader := "selector-reader"
	bindReader(t, reader)
	cred := credential{cert: clientCert(t, reader)}
	base := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	// The whole collection first, through every way in: the tiers'
	// reviews of this user's "list configmaps" are cached (10 s), as are
	// the shards' reviews of a fleet front's calls.
	want := apiserver.send(t, cred, base)
	for _, tg := range targets {
		sameList(t, tg, tg.send(t, cred, base), want)
	}
	var paths []string
	for _, sel := range []string{
		"labelSelector=app%3Dedges",
		"labelSelector=app+in+%28edges%2Cother%29",
		"labelSelector=app%21%3Dnone",
		"labelSelector=%21missing",
		"fieldSelector=metadata.namespace%3D" + dataNamespace,
		"fieldSelector=metadata.name%21%3Dcm-0",
		"fieldSelector=metadata.name%21%3Dcm-1&labelSelector=app%3Dedges",
	} {
		paths = append(paths, base+"?"+sel)
	}
	start := time.Now()
	for _, path := range paths {
		want := apiserver.send(t, cred, path)
		for _, tg := range targets {
			sameList(t, tg, tg.send(t, cred, path), want)
		}
	}
	end := time.Now()
	// The reviews about this user's reads (the audit log has each review
	// asked): the tiers' other reviews — the aggregator's availability
	// checks, a fleet's shards authorizing its front — come and go with
	// their own caches.
	reviews := map[string]int{}
	for _, r := range tierReviews(t, start) {
		if r.spec.User == reader && !r.at.After(end) {
			reviews[r.tier]++
			t.Logf("%s asked about %s: %+v", r.tier, reader, r.spec.ResourceAttributes)
		}
	}
	t.Logf("%d selector reads through %d ways in took %s; SubjectAccessReviews about them the tiers sent: %v", len(paths), len(targets), end.Sub(start).Round(time.Millisecond), reviews)
	// Within three quarters of the TTL of the whole collection's reads,
	// the broad answer is not even renewed (renewal.go): any review about
	// this user is one about a selector.
	if end.Sub(start) < 5*time.Second {
		for tier, n := range reviews {
			t.Errorf("%s sent %d SubjectAccessReviews for reads of a collection its user may read, with %d selectors: selectors were asked about", tier, n, len(paths))
		}
	}

	node := credential{cert: clientCert(t, "system:node:edges-node", "system:nodes")}
	path := base + "?labelSelector=app%3Dedges"
	refused := apiserver.send(t, node, path)
	if !strings.Contains(string(refused.body), "system:node:edges-node") {
		t.Fatalf("the apiserver's refusal does not name the node: %s", refused)
	}
	for _, tg := range targets {
		sameRefusal(t, tg, tg.send(t, node, path), refused)
	}
}

package authedges

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
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
	// A review's event is written when its response is complete, which
	// may be a moment after the tier has its answer.
	time.Sleep(time.Second)
	events, err := cp.ReadAudit(start)
	if err != nil {
		t.Fatal(err)
	}
	// The reviews about this user's reads (the audit log has each review
	// asked): the tiers' other reviews — the aggregator's availability
	// checks, a fleet's shards authorizing its front — come and go with
	// their own caches.
	reviews := map[string]int{}
	for _, ev := range events {
		if !tierUsers[ev.User.Username] || ev.RequestReceivedTimestamp.After(end) || ev.ObjectRef == nil || ev.ObjectRef.Resource != "subjectaccessreviews" {
			continue
		}
		if ev.RequestObject == nil {
			t.Fatalf("the audit log has no review in %s's SubjectAccessReview", ev.User.Username)
		}
		var sar authorizationv1.SubjectAccessReview
		if err := json.Unmarshal(ev.RequestObject.Raw, &sar); err != nil {
			t.Fatalf("decode %s's SubjectAccessReview: %v", ev.User.Username, err)
		}
		if sar.Spec.User == reader {
			reviews[ev.User.Username]++
			t.Logf("%s asked about %s: %+v", ev.User.Username, reader, sar.Spec.ResourceAttributes)
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

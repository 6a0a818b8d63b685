package authedges

import (
	"encoding/json"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
)

// tierReview is a SubjectAccessReview a tier sent the apiserver, as its
// audit log has it (auditPolicy logs the review asked).
type tierReview struct {
	// tier is the tier's identity, at when the apiserver received it.
	tier string
	at   time.Time
	spec authorizationv1.SubjectAccessReviewSpec
}

// tierReviews reads the SubjectAccessReviews the tiers sent since since.
// A review's event is written when its response is complete, which may
// be a moment after the tier has its answer: it waits a second first.
func tierReviews(t *testing.T, since time.Time) []tierReview {
	t.Helper()
	time.Sleep(time.Second)
	events, err := cp.ReadAudit(since)
	if err != nil {
		t.Fatal(err)
	}
	var out []tierReview
	for _, ev := range events {
		if !tierUsers[ev.User.Username] || ev.ObjectRef == nil || ev.ObjectRef.Resource != "subjectaccessreviews" {
			continue
		}
		if ev.RequestObject == nil {
			t.Fatalf("the audit log has no review in %s's SubjectAccessReview", ev.User.Username)
		}
		var sar authorizationv1.SubjectAccessReview
		if err := json.Unmarshal(ev.RequestObject.Raw, &sar); err != nil {
			t.Fatalf("decode %s's SubjectAccessReview: %v", ev.User.Username, err)
		}
		out = append(out, tierReview{tier: ev.User.Username, at: ev.RequestReceivedTimestamp.Time, spec: sar.Spec})
	}
	return out
}

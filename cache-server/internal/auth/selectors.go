package auth

import (
	"context"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// Selectors only narrow access. Since Kubernetes 1.31 a LIST's or WATCH's
// field and label selectors are authorization attributes
// (AuthorizeWithSelectors), and the SubjectAccessReview the tier sends
// carries them, so the reviews' cache — keyed by the whole review — shares
// no answer between two selectors. A DaemonSet's agents, one
// ServiceAccount on every node, each LIST and WATCH the Pods of their own
// node: 2,000 nodes were 2,000 distinct reviews per cache TTL where one
// would do, and each node-scoped read waited for its own round trip to
// the apiserver.
//
// The API says a selector in a review "can only limit access, not
// broaden it" (authorization/v1 ResourceAttributes). So a request allowed
// without its selectors is allowed with them: the tier first asks about
// the request without its selectors, an answer every selector of the same
// user, verb and resource shares, and asks about the selectors only when
// that is not an allow. kube-apiserver authorizes the same request with
// the selectors in one step; the decision is the same for every
// authorizer that keeps the API's rule.
//
// Nodes are asked with their selectors straight away: the Node authorizer
// allows a kubelet (group system:nodes) the Pods of its own node by
// spec.nodeName and never the Pods of all nodes, so the broad question
// would be one denied review more per kubelet.

// nodesGroup is the group of kubelets' identities.
const nodesGroup = "system:nodes"

// selectorsNarrow asks inner about a request without its selectors first
// (see above).
type selectorsNarrow struct {
	inner authorizer.Authorizer
	// results counts selector requests by how they were decided (may be
	// nil): broad (allowed without the selectors), narrow (asked with
	// them after the broad question was not an allow), node (a node's,
	// asked with them at once).
	results *prometheus.CounterVec
}

func (s *selectorsNarrow) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	broad, ok := withoutSelectors(a)
	if !ok {
		return s.inner.Authorize(ctx, a)
	}
	if isNode(a) {
		s.count("node")
		return s.inner.Authorize(ctx, a)
	}
	if d, reason, err := s.inner.Authorize(ctx, broad); err == nil && d == authorizer.DecisionAllow {
		s.count("broad")
		return d, reason, nil
	}
	s.count("narrow")
	return s.inner.Authorize(ctx, a)
}

func (s *selectorsNarrow) count(result string) {
	if s.results != nil {
		s.results.WithLabelValues(result).Inc()
	}
}

func isNode(a authorizer.Attributes) bool {
	u := a.GetUser()
	if u == nil {
		return false
	}
	for _, g := range u.GetGroups() {
		if g == nodesGroup {
			return true
		}
	}
	return strings.HasPrefix(u.GetName(), "system:node:")
}

// withoutSelectors is a resource request's attributes without its field
// and label selectors, and whether it had any that parsed (a request
// whose selectors do not parse is asked about as it is: the review
// carries what the apiserver makes of them).
func withoutSelectors(a authorizer.Attributes) (authorizer.AttributesRecord, bool) {
	if !a.IsResourceRequest() {
		return authorizer.AttributesRecord{}, false
	}
	fs, ferr := a.GetFieldSelector()
	ls, lerr := a.GetLabelSelector()
	if ferr != nil || lerr != nil || len(fs) == 0 && len(ls) == 0 {
		return authorizer.AttributesRecord{}, false
	}
	return authorizer.AttributesRecord{
		User:            a.GetUser(),
		Verb:            a.GetVerb(),
		Namespace:       a.GetNamespace(),
		APIGroup:        a.GetAPIGroup(),
		APIVersion:      a.GetAPIVersion(),
		Resource:        a.GetResource(),
		Subresource:     a.GetSubresource(),
		Name:            a.GetName(),
		ResourceRequest: true,
		Path:            a.GetPath(),
	}, true
}

// ConditionsAwareAuthorize is Authorize, as the interface asks of an
// authorizer that is not conditions-aware: the tier serves reads only.
func (s *selectorsNarrow) ConditionsAwareAuthorize(ctx context.Context, a authorizer.Attributes) authorizer.ConditionsAwareDecision {
	return authorizer.ConditionsAwareDecisionFromParts(s.Authorize(ctx, a))
}

// EvaluateConditions fails closed, as the interface asks.
func (s *selectorsNarrow) EvaluateConditions(context.Context, authorizer.ConditionsAwareDecision, authorizer.ConditionsData) (authorizer.Decision, string, error) {
	return authorizer.DecisionDeny, "", authorizer.ErrorConditionEvaluationNotSupported
}

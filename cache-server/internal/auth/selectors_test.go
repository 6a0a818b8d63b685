package auth

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// policyAuthorizer allows what allow says and records what it was asked.
type policyAuthorizer struct {
	authorizer.Authorizer
	allow func(a authorizer.Attributes) (authorizer.Decision, error)
	asked []authorizer.Attributes
}

func (p *policyAuthorizer) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	p.asked = append(p.asked, a)
	d, err := p.allow(a)
	return d, "policy", err
}

func hasSelectors(a authorizer.Attributes) bool {
	fs, _ := a.GetFieldSelector()
	ls, _ := a.GetLabelSelector()
	return len(fs) > 0 || len(ls) > 0
}

func TestSelectorsNarrow(t *testing.T) {
	byNode := fields.Requirements{{Field: "spec.nodeName", Operator: selection.Equals, Value: "n1"}}
	app, err := labels.NewRequirement("app", selection.Equals, []string{"agent"})
	if err != nil {
		t.Fatal(err)
	}
	list := authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "system:serviceaccount:agents:agent"}, Verb: "list", Namespace: "", APIVersion: "v1", Resource: "pods", ResourceRequest: true, Path: "/api/v1/pods"}
	withField, withLabel := list, list
	withField.FieldSelectorRequirements = byNode
	withLabel.LabelSelectorRequirements = labels.Requirements{*app}
	badSelector := withField
	badSelector.FieldSelectorParsingErr = errors.New("unparsable")
	node := withField
	node.User = &user.DefaultInfo{Name: "system:node:n1", Groups: []string{"system:nodes", "system:authenticated"}}
	nonResource := authorizer.AttributesRecord{User: list.User, Verb: "get", Path: "/healthz"}

	allowAll := func(authorizer.Attributes) (authorizer.Decision, error) { return authorizer.DecisionAllow, nil }
	onlyWithSelectors := func(a authorizer.Attributes) (authorizer.Decision, error) {
		if hasSelectors(a) {
			return authorizer.DecisionAllow, nil
		}
		return authorizer.DecisionNoOpinion, nil
	}
	broadFails := func(a authorizer.Attributes) (authorizer.Decision, error) {
		if hasSelectors(a) {
			return authorizer.DecisionAllow, nil
		}
		return authorizer.DecisionNoOpinion, errors.New("apiserver unreachable")
	}
	denyAll := func(authorizer.Attributes) (authorizer.Decision, error) { return authorizer.DecisionDeny, nil }

	for _, c := range []struct {
		name   string
		policy func(authorizer.Attributes) (authorizer.Decision, error)
		attrs  authorizer.AttributesRecord
		want   authorizer.Decision
		// asked: for each question to inner, whether it carried selectors.
		asked  []bool
		result string
	}{
		{"no selectors: asked as it is", allowAll, list, authorizer.DecisionAllow, []bool{false}, ""},
		{"allowed without its field selector", allowAll, withField, authorizer.DecisionAllow, []bool{false}, "broad"},
		{"allowed without its label selector", allowAll, withLabel, authorizer.DecisionAllow, []bool{false}, "broad"},
		{"allowed only with its selector", onlyWithSelectors, withField, authorizer.DecisionAllow, []bool{false, true}, "narrow"},
		{"the broad question fails: asked with the selector", broadFails, withField, authorizer.DecisionAllow, []bool{false, true}, "narrow"},
		{"denied both ways", denyAll, withField, authorizer.DecisionDeny, []bool{false, true}, "narrow"},
		{"a node: asked with its selector at once", onlyWithSelectors, node, authorizer.DecisionAllow, []bool{true}, "node"},
		{"a selector that did not parse: asked as it is", allowAll, badSelector, authorizer.DecisionAllow, []bool{true}, ""},
		{"not a resource request", allowAll, nonResource, authorizer.DecisionAllow, []bool{false}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"result"})
			inner := &policyAuthorizer{allow: c.policy}
			s := &selectorsNarrow{inner: inner, results: results}
			d, _, err := s.Authorize(context.Background(), c.attrs)
			if d != c.want || err != nil {
				t.Fatalf("decision %v, %v; want %v", d, err, c.want)
			}
			if len(inner.asked) != len(c.asked) {
				t.Fatalf("asked %d times, want %d", len(inner.asked), len(c.asked))
			}
			for i, a := range inner.asked {
				if hasSelectors(a) != c.asked[i] {
					t.Errorf("question %d carried selectors: %v, want %v", i, hasSelectors(a), c.asked[i])
				}
				// Everything else is the request's.
				if a.GetUser() != c.attrs.GetUser() || a.GetVerb() != c.attrs.GetVerb() || a.GetResource() != c.attrs.GetResource() ||
					a.GetNamespace() != c.attrs.GetNamespace() || a.GetAPIVersion() != c.attrs.GetAPIVersion() || a.IsResourceRequest() != c.attrs.IsResourceRequest() {
					t.Errorf("question %d is %+v, the request %+v", i, a, c.attrs)
				}
			}
			for _, r := range []string{"broad", "narrow", "node"} {
				want := 0.0
				if r == c.result {
					want = 1
				}
				if got := testutil.ToFloat64(results.WithLabelValues(r)); got != want {
					t.Errorf("%s counted %v, want %v", r, got, want)
				}
			}
		})
	}
}

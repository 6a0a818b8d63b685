package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// testInvalidProfilesRejected runs against the harness's apiserver: the CRD
// schema (markers and CEL rules) refuses bad specs at admission with
// messages that say what is wrong.
func testInvalidProfilesRejected(t *testing.T, h *harness) {
	for name, tc := range map[string]struct {
		mut  func(*cachev1alpha1.CacheProfile)
		want string
	}{
		"negative shards":      {func(p *cachev1alpha1.CacheProfile) { p.Spec.Shards = -1 }, "spec.shards in body should be greater than or equal to 1"},
		"negative hash shards": {func(p *cachev1alpha1.CacheProfile) { p.Spec.HashShards = -3 }, "spec.hashShards in body should be greater than or equal to 1"},
		"more shards than hash shards": {func(p *cachev1alpha1.CacheProfile) { p.Spec.HashShards, p.Spec.Shards = 2, 3 },
			"shards must not exceed hashShards"},
		"duplicate resources": {func(p *cachev1alpha1.CacheProfile) {
			p.Spec.Resources = append(p.Spec.Resources, cachev1alpha1.CachedResource{Version: "v1", Resource: "pods"})
		}, "resources must be unique"},
		"invalid selector operator": {func(p *cachev1alpha1.CacheProfile) {
			p.Spec.Resources[0].LabelSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near", Values: []string{"b"}}}}
		}, "labelSelector: matchExpressions operator must be one of In, NotIn, Exists, DoesNotExist"},
		"In without values": {func(p *cachev1alpha1.CacheProfile) {
			p.Spec.Resources[1].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "In"}}}
		}, "namespaceSelector: operators In and NotIn need at least one value"},
		"freshness timeout too long": {func(p *cachev1alpha1.CacheProfile) {
			p.Spec.FreshnessTimeout = &metav1.Duration{Duration: 2 * time.Minute}
		},
			"freshnessTimeout must be between 100ms and 60s"},
		"history window too short": {func(p *cachev1alpha1.CacheProfile) {
			p.Spec.HistoryWindow = &metav1.Duration{Duration: 10 * time.Second}
		},
			"historyWindow must be between 75s and 1h"},
		"bad field index": {func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources[0].FieldIndexes = []string{"spec..nodeName"} },
			"spec.resources[0].fieldIndexes[0]: Invalid value"},
		"no resources":  {func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources = nil }, "spec.resources: Required value"},
		"bad version":   {func(p *cachev1alpha1.CacheProfile) { p.Spec.Resources[0].Version = "1" }, "spec.resources[0].version: Invalid value"},
		"name too long": {func(p *cachev1alpha1.CacheProfile) { p.Name = strings.Repeat("x", 41) }, "metadata.name must be a DNS label of at most 40 characters"},
	} {
		p := newProfile()
		p.Name = "invalid"
		tc.mut(p)
		err := h.client.Create(context.Background(), p)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want Invalid containing %q", name, err, tc.want)
		}
	}
}

package controllers

import (
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

func readySTS(name string, replicas, ready int32) *appsv1.StatefulSet {
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(replicas)}}
	s.Status = appsv1.StatefulSetStatus{ObservedGeneration: 1, Replicas: replicas, ReadyReplicas: ready, UpdatedReplicas: replicas, CurrentRevision: "r1", UpdateRevision: "r1"}
	return s
}

func readyDeploy(replicas, avail int32) *appsv1.Deployment {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "fleet-front", Generation: 1}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas)}}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: replicas, UpdatedReplicas: replicas, ReadyReplicas: avail, AvailableReplicas: avail}
	return d
}

func apiSvc(status apiregv1.ConditionStatus, reason string) *apiregv1.APIService {
	return &apiregv1.APIService{ObjectMeta: metav1.ObjectMeta{Name: "v1alpha1.fleet.cache.cachetier.io"},
		Status: apiregv1.APIServiceStatus{Conditions: []apiregv1.APIServiceCondition{{Type: apiregv1.Available, Status: status, Reason: reason, Message: "m"}}}}
}

func healthy() Observed {
	return Observed{
		Shards: map[string]*appsv1.StatefulSet{
			"fleet-shard-0": readySTS("fleet-shard-0", 2, 2), "fleet-shard-1": readySTS("fleet-shard-1", 2, 2), "fleet-shard-2": readySTS("fleet-shard-2", 2, 2),
		},
		Front:      readyDeploy(2, 2),
		APIService: apiSvc(apiregv1.ConditionTrue, "Passed"),
	}
}

func cond(st cachev1alpha1.CacheProfileStatus, t string) metav1.Condition {
	c := meta.FindStatusCondition(st.Conditions, t)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

func TestComputeStatus(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	type want struct{ avail, prog, degr, reasonA, reasonD string }
	for name, tc := range map[string]struct {
		obs  func() Observed
		want want
	}{
		"healthy": {healthy, want{"True", "False", "False", ReasonAvailable, ReasonAsExpected}},
		"just created": {func() Observed { return Observed{Shards: map[string]*appsv1.StatefulSet{}} },
			want{"False", "True", "False", ReasonShardsUnavailable, ReasonAsExpected}},
		"rolling, apiservice pending": {func() Observed {
			o := healthy()
			o.Shards["fleet-shard-1"].Generation = 2
			o.APIService = apiSvc(apiregv1.ConditionFalse, "MissingEndpoints")
			return o
		}, want{"False", "True", "False", ReasonAPIServiceUnavailable, ReasonAsExpected}},
		"shard down": {func() Observed {
			o := healthy()
			o.Shards["fleet-shard-1"].Status.ReadyReplicas = 0
			return o
		}, want{"False", "False", "True", ReasonShardsUnavailable, ReasonShardUnready}},
		"shard half ready": {func() Observed {
			o := healthy()
			o.Shards["fleet-shard-2"].Status.ReadyReplicas = 1
			return o
		}, want{"True", "False", "True", ReasonAvailable, ReasonShardUnready}},
		"front down": {func() Observed {
			o := healthy()
			o.Front = readyDeploy(2, 0)
			return o
		}, want{"False", "False", "True", ReasonFrontUnavailable, ReasonFrontUnready}},
		"apiservice failing": {func() Observed {
			o := healthy()
			o.APIService = apiSvc(apiregv1.ConditionFalse, "FailedDiscoveryCheck")
			return o
		}, want{"False", "False", "True", ReasonAPIServiceUnavailable, ReasonAPIServiceUnavailable}},
		"apiservice missing": {func() Observed {
			o := healthy()
			o.APIService = nil
			return o
		}, want{"False", "False", "True", ReasonAPIServiceUnavailable, ReasonAPIServiceUnavailable}},
		"apply failed": {func() Observed {
			o := healthy()
			o.ApplyError = "Service fleet-front: boom"
			return o
		}, want{"True", "False", "True", ReasonAvailable, ReasonApplyFailed}},
		"invalid": {func() Observed { return Observed{InvalidSpec: "bad"} }, want{"False", "False", "True", ReasonInvalidSpec, ReasonInvalidSpec}},
		"shrinking": {func() Observed {
			o := healthy()
			o.SurplusShards = []string{"fleet-shard-3"}
			return o
		}, want{"True", "True", "False", ReasonAvailable, ReasonAsExpected}},
	} {
		st := ComputeStatus(testProfile(), testOpts, tc.obs(), now)
		a, pr, d := cond(st, "Available"), cond(st, "Progressing"), cond(st, "Degraded")
		got := want{string(a.Status), string(pr.Status), string(d.Status), a.Reason, d.Reason}
		if got != tc.want {
			t.Errorf("%s: got %+v want %+v (messages: %q / %q / %q)", name, got, tc.want, a.Message, pr.Message, d.Message)
		}
		if a.ObservedGeneration != 3 || st.ObservedGeneration != 3 {
			t.Errorf("%s: observedGeneration not set", name)
		}
	}

	st := ComputeStatus(testProfile(), testOpts, func() Observed { o := healthy(); o.Shards["fleet-shard-1"].Status.ReadyReplicas = 0; return o }(), now)
	if d := cond(st, "Degraded"); !strings.Contains(d.Message, "fleet-shard-1 (0/2 ready)") {
		t.Errorf("degraded message does not name the shard: %q", d.Message)
	}
	if st.Ready != "2/3" || st.ReadyShards != 2 || len(st.Shards) != 3 || st.Shards[1].HashShards != "4-6" || st.Shards[1].ReadyReplicas != 0 {
		t.Errorf("shard status: %+v", st)
	}
	if st.APIServiceName != "v1alpha1.fleet.cache.cachetier.io" || st.ServerURL != "https://api.example.com:6443/apis/fleet.cache.cachetier.io/v1alpha1/watch" {
		t.Errorf("names: %s %s", st.APIServiceName, st.ServerURL)
	}
}

// Recomputing an unchanged state must give an identical status, including
// transition times: otherwise every reconcile would write.
func TestComputeStatusIsStable(t *testing.T) {
	p := testProfile()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p.Status = ComputeStatus(p, testOpts, healthy(), t0)
	again := ComputeStatus(p, testOpts, healthy(), t0.Add(time.Hour))
	if !equalStatus(p.Status, again) {
		t.Fatalf("status changed without a change:\n%+v\n%+v", p.Status, again)
	}
	o := healthy()
	o.Front = readyDeploy(2, 0)
	changed := ComputeStatus(p, testOpts, o, t0.Add(time.Hour))
	if c := cond(changed, "Available"); !c.LastTransitionTime.Time.Equal(t0.Add(time.Hour)) {
		t.Errorf("transition time not updated: %s", c.LastTransitionTime)
	}
	if c := cond(changed, "Progressing"); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("unchanged condition's transition time moved: %s", c.LastTransitionTime)
	}
}

func equalStatus(a, b cachev1alpha1.CacheProfileStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

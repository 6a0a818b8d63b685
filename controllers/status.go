package controllers

import (
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// Condition reasons. Each names what is wrong (or right) so that a user
// knows where to look.
const (
	ReasonAvailable             = "Available"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonApplyFailed           = "ApplyFailed"
	ReasonShardsUnavailable     = "ShardsUnavailable"
	ReasonShardUnready          = "ShardUnready"
	ReasonFrontUnavailable      = "FrontUnavailable"
	ReasonFrontUnready          = "FrontUnready"
	ReasonAPIServiceUnavailable = "APIServiceUnavailable"
	ReasonNodeUnavailable       = "NodeUnavailable"
	ReasonRollingOut            = "RollingOut"
	ReasonShardCountChanging    = "ShardCountChanging"
	ReasonRolloutComplete       = "RolloutComplete"
	ReasonAsExpected            = "AsExpected"
)

// Observed is what the reconciler saw of a profile's children after
// applying them.
type Observed struct {
	// Shards by StatefulSet name; a missing entry means not found.
	Shards map[string]*appsv1.StatefulSet
	// SurplusShards are shard StatefulSets left from a larger shard count
	// that are not removed yet.
	SurplusShards []string
	Front         *appsv1.Deployment
	// APIService is nil when not found (or not wanted).
	APIService *apiregv1.APIService
	// InvalidSpec explains why the spec cannot be rolled out.
	InvalidSpec string
	// ApplyError names the child that could not be written and why.
	ApplyError string
	// NodeProblems are nodes that are not Ready with fleet pods on them.
	NodeProblems []NodeProblem
}

// statefulSetRollingOut: the controller has not caught up with the spec, or
// not every replica runs the current revision yet. Unready replicas during
// a rollout are expected; outside of one they mean something is broken.
func statefulSetRollingOut(s *appsv1.StatefulSet) bool {
	want := int32(1)
	if s.Spec.Replicas != nil {
		want = *s.Spec.Replicas
	}
	st := s.Status
	return st.ObservedGeneration < s.Generation || st.UpdatedReplicas < want ||
		(st.UpdateRevision != "" && st.CurrentRevision != st.UpdateRevision) || st.Replicas > want
}

func deploymentRollingOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	return st.ObservedGeneration < d.Generation || st.UpdatedReplicas < want || st.Replicas > want
}

// ComputeStatus derives the profile status from its observed children. It
// keeps LastTransitionTime of conditions whose status did not change, so
// recomputing an unchanged state yields an identical status (and no write).
func ComputeStatus(in *cachev1alpha1.CacheProfile, opts Options, obs Observed, now time.Time) cachev1alpha1.CacheProfileStatus {
	p := WithDefaults(in)
	st := cachev1alpha1.CacheProfileStatus{
		ObservedGeneration: p.Generation,
		Conditions:         append([]metav1.Condition(nil), in.Status.Conditions...),
		ServerURL:          ServerURL(opts.APIServerURL, p),
	}
	apiServiceWanted := *p.Spec.Expose.APIService.Enabled
	if apiServiceWanted {
		st.APIServiceName = APIServiceName(p)
	}
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		c := metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: p.Generation}
		if old := meta.FindStatusCondition(st.Conditions, t); old != nil && old.Status == s {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
		}
		meta.SetStatusCondition(&st.Conditions, c)
	}

	if obs.InvalidSpec != "" {
		set(cachev1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonInvalidSpec, obs.InvalidSpec)
		set(cachev1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonInvalidSpec, "the spec cannot be rolled out: "+obs.InvalidSpec)
		set(cachev1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonInvalidSpec, obs.InvalidSpec)
		return st
	}

	var rolling, noneReady, unready, unreadyNames []string
	for _, a := range AssignHashShards(p) {
		ss := cachev1alpha1.ShardStatus{Name: a.Name, HashShards: a.HashShardRange(), Replicas: p.Spec.ReplicasPerShard}
		sts := obs.Shards[a.Name]
		switch {
		case sts == nil:
			rolling = append(rolling, a.Name+" (not created)")
			noneReady = append(noneReady, a.Name)
		default:
			ss.ReadyReplicas = sts.Status.ReadyReplicas
			isRolling := statefulSetRollingOut(sts)
			if isRolling {
				rolling = append(rolling, a.Name)
			}
			if ss.ReadyReplicas == 0 {
				noneReady = append(noneReady, a.Name)
			}
			if !isRolling && ss.ReadyReplicas < ss.Replicas {
				unready = append(unready, fmt.Sprintf("%s (%d/%d ready)", a.Name, ss.ReadyReplicas, ss.Replicas))
				unreadyNames = append(unreadyNames, a.Name)
			}
		}
		if ss.ReadyReplicas > 0 {
			st.ReadyShards++
		}
		st.Shards = append(st.Shards, ss)
	}
	st.Ready = fmt.Sprintf("%d/%d", st.ReadyShards, p.Spec.Shards)

	frontRolling, frontAvailable, frontUnready := true, false, ""
	if f := obs.Front; f != nil {
		st.FrontReadyReplicas = f.Status.ReadyReplicas
		frontRolling = deploymentRollingOut(f)
		frontAvailable = f.Status.AvailableReplicas > 0
		if !frontRolling && f.Status.AvailableReplicas < p.Spec.FrontReplicas {
			frontUnready = fmt.Sprintf("front %s has %d/%d available replicas", f.Name, f.Status.AvailableReplicas, p.Spec.FrontReplicas)
		}
	}
	st.Front = fmt.Sprintf("%d/%d", st.FrontReadyReplicas, p.Spec.FrontReplicas)
	if frontRolling {
		rolling = append(rolling, frontName(p))
	}

	apiOK, apiMsg := true, ""
	if apiServiceWanted {
		apiOK = false
		switch a := obs.APIService; {
		case a == nil:
			apiMsg = "APIService " + APIServiceName(p) + " not found"
		default:
			apiMsg = "APIService " + a.Name + " has no Available condition yet"
			for _, c := range a.Status.Conditions {
				if c.Type == apiregv1.Available {
					apiOK = c.Status == apiregv1.ConditionTrue
					apiMsg = fmt.Sprintf("APIService %s is not Available: %s: %s", a.Name, c.Reason, c.Message)
				}
			}
		}
	}

	// Available: clients get answers.
	switch {
	case len(noneReady) > 0:
		set(cachev1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonShardsUnavailable, "shards without a ready replica: "+strings.Join(noneReady, ", ")+
			"; reads of their hash shards wait and answer 504 (look at: "+inspect(opts, noneReady...)+")")
	case !frontAvailable:
		set(cachev1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonFrontUnavailable, "front "+frontName(p)+" has no available replica; clients of the APIService get 503 (look at: "+inspectFront(p, opts)+")")
	case !apiOK:
		set(cachev1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonAPIServiceUnavailable, apiMsg)
	default:
		set(cachev1alpha1.ConditionAvailable, metav1.ConditionTrue, ReasonAvailable, fmt.Sprintf("%d shards and the front are serving", p.Spec.Shards))
	}

	// Progressing: a rollout is under way.
	switch {
	case len(obs.SurplusShards) > 0:
		set(cachev1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonShardCountChanging,
			"removing "+strings.Join(obs.SurplusShards, ", ")+" once every remaining shard is rolled out and ready and no replaced front pod is left")
	case len(rolling) > 0:
		set(cachev1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonRollingOut, "rolling out: "+strings.Join(rolling, ", "))
	default:
		set(cachev1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonRolloutComplete, "every shard and the front run the current spec")
	}

	// Degraded: something that should work does not. Unready parts during a
	// rollout are expected and not reported here; the APIService is only
	// expected to be available once nothing is rolling out.
	var problems []string
	reason := ""
	add := func(r, msg string) {
		if reason == "" {
			reason = r
		}
		problems = append(problems, msg)
	}
	if obs.ApplyError != "" {
		add(ReasonApplyFailed, obs.ApplyError)
	}
	// A lost node first: it is the cause of the unready replicas below.
	if len(obs.NodeProblems) > 0 {
		add(ReasonNodeUnavailable, nodeProblemMessage(obs.NodeProblems))
	}
	if len(unready) > 0 {
		add(ReasonShardUnready, "shards with unready replicas: "+strings.Join(unready, ", ")+" (look at: "+inspect(opts, unreadyNames...)+")")
	}
	if frontUnready != "" {
		add(ReasonFrontUnready, frontUnready+" (look at: "+inspectFront(p, opts)+")")
	}
	if !apiOK && len(rolling) == 0 {
		add(ReasonAPIServiceUnavailable, apiMsg)
	}
	if reason != "" {
		set(cachev1alpha1.ConditionDegraded, metav1.ConditionTrue, reason, strings.Join(problems, "; "))
	} else {
		set(cachev1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected, "no failing part")
	}
	return st
}

// inspect names the command that shows why shard pods are not ready (their
// events and probe failures), so a condition message says where to look.
func inspect(opts Options, statefulSets ...string) string {
	return fmt.Sprintf("kubectl -n %s describe statefulset %s, then the pods' events and logs", opts.Namespace, strings.Join(statefulSets, " "))
}

func inspectFront(p *cachev1alpha1.CacheProfile, opts Options) string {
	return fmt.Sprintf("kubectl -n %s describe deployment %s, then the pods' events and logs", opts.Namespace, frontName(p))
}

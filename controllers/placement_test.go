package controllers

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
)

// hostnameSpread returns the pod spec's spread constraint over
// kubernetes.io/hostname, if any.
func hostnameSpread(spec corev1.PodSpec) *corev1.TopologySpreadConstraint {
	for i, c := range spec.TopologySpreadConstraints {
		if c.TopologyKey == corev1.LabelHostname {
			return &spec.TopologySpreadConstraints[i]
		}
	}
	return nil
}

// TestPlacementSpreadsEachReplicaSetOverNodes: every shard's pods, and the
// fronts, carry a required spread over nodes that selects exactly their
// own replica set (its pods, not another shard's), honours node taints
// (a cordoned or lost node is no domain) and node affinity, and the
// tolerations that let Kubernetes evict them from a lost node after 30 s.
func TestPlacementSpreadsEachReplicaSetOverNodes(t *testing.T) {
	p := testProfile()
	d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{})
	if err != nil {
		t.Fatal(err)
	}
	type set struct {
		name   string
		tmpl   corev1.PodTemplateSpec
		others []map[string]string // labels of pods of the other sets
	}
	var sets []set
	for _, s := range d.Shards {
		sets = append(sets, set{name: s.Name, tmpl: s.Spec.Template})
	}
	sets = append(sets, set{name: d.Front.Name, tmpl: d.Front.Spec.Template})
	for i := range sets {
		for j := range sets {
			if i != j {
				sets[i].others = append(sets[i].others, sets[j].tmpl.Labels)
			}
		}
	}
	for _, s := range sets {
		spec := s.tmpl.Spec
		c := hostnameSpread(spec)
		if c == nil {
			t.Fatalf("%s: no spread over nodes: %+v", s.name, spec.TopologySpreadConstraints)
		}
		if c.MaxSkew != 1 || c.WhenUnsatisfiable != corev1.DoNotSchedule || c.NodeTaintsPolicy == nil || *c.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor ||
			c.NodeAffinityPolicy == nil || *c.NodeAffinityPolicy != corev1.NodeInclusionPolicyHonor || len(c.MatchLabelKeys) != 0 {
			t.Errorf("%s: spread %+v, want maxSkew 1, DoNotSchedule, taints and affinity honoured", s.name, c)
		}
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(s.tmpl.Labels)) {
			t.Errorf("%s: the spread does not select its own pods (%v over %v)", s.name, sel, s.tmpl.Labels)
		}
		for _, o := range s.others {
			if sel.Matches(labels.Set(o)) {
				t.Errorf("%s: the spread also counts another set's pods %v", s.name, o)
			}
		}
		if spec.Affinity != nil {
			t.Errorf("%s: affinity %+v rendered without the profile asking for one", s.name, spec.Affinity)
		}
		for _, key := range []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady} {
			found := false
			for _, tol := range spec.Tolerations {
				if tol.Key == key && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoExecute &&
					tol.TolerationSeconds != nil && *tol.TolerationSeconds == NodeLossTolerationSeconds {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no %d s NoExecute toleration of %s: %+v", s.name, NodeLossTolerationSeconds, key, spec.Tolerations)
			}
		}
		// The taint a drain puts on a node must not be tolerated: it is
		// what keeps the drained node out of the spread's domains.
		for _, tol := range spec.Tolerations {
			if tol.ToleratesTaint(klog.Background(), &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, false) ||
				tol.ToleratesTaint(klog.Background(), &corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}, false) {
				t.Errorf("%s: toleration %+v lets a cordoned or lost node count", s.name, tol)
			}
		}
	}
}

// TestPlacementKeepsTheProfilesOwn: the profile's constraints and
// tolerations come first and unchanged; its own spread over hostnames
// replaces the operator's, and its own toleration of a node-loss taint
// replaces the operator's for that taint only.
func TestPlacementKeepsTheProfilesOwn(t *testing.T) {
	zone := corev1.TopologySpreadConstraint{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway}
	host := corev1.TopologySpreadConstraint{MaxSkew: 2, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway}
	unreachable := corev1.Toleration{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](600)}
	dedicated := corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "cache", Effect: corev1.TaintEffectNoSchedule}
	everything := corev1.Toleration{Operator: corev1.TolerationOpExists}
	own := map[string]string{"a": "b"}
	for _, tc := range []struct {
		name        string
		sched       cachev1alpha1.Scheduling
		wantSpread  []string // topology keys, in order
		wantTolKeys []string
	}{
		{"nothing set", cachev1alpha1.Scheduling{}, []string{corev1.LabelHostname}, []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady}},
		{"a zone spread", cachev1alpha1.Scheduling{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{zone}},
			[]string{"topology.kubernetes.io/zone", corev1.LabelHostname}, []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady}},
		{"its own hostname spread", cachev1alpha1.Scheduling{TopologySpreadConstraints: []corev1.TopologySpreadConstraint{zone, host}},
			[]string{"topology.kubernetes.io/zone", corev1.LabelHostname}, []string{corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady}},
		{"its own unreachable toleration", cachev1alpha1.Scheduling{Tolerations: []corev1.Toleration{dedicated, unreachable}},
			[]string{corev1.LabelHostname}, []string{"dedicated", corev1.TaintNodeUnreachable, corev1.TaintNodeNotReady}},
		{"tolerates everything", cachev1alpha1.Scheduling{Tolerations: []corev1.Toleration{everything}},
			[]string{corev1.LabelHostname}, []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tols, spread := placement(tc.sched, own)
			var keys []string
			for _, c := range spread {
				keys = append(keys, c.TopologyKey)
			}
			if !slices.Equal(keys, tc.wantSpread) {
				t.Errorf("spread over %v, want %v", keys, tc.wantSpread)
			}
			if len(tc.sched.TopologySpreadConstraints) == 2 && spread[1].MaxSkew != 2 {
				t.Errorf("the profile's hostname spread was changed: %+v", spread[1])
			}
			var tk []string
			for _, tol := range tols {
				tk = append(tk, tol.Key)
				if tol.Key == corev1.TaintNodeUnreachable && len(tc.sched.Tolerations) == 2 && *tol.TolerationSeconds != 600 {
					t.Errorf("the profile's toleration was changed: %+v", tol)
				}
			}
			if !slices.Equal(tk, tc.wantTolKeys) {
				t.Errorf("tolerations of %v, want %v", tk, tc.wantTolKeys)
			}
		})
	}
}

// TestPDBsLetDrainsProceedOneAtATime: one unavailable pod per shard and
// for the fronts, whatever the replica count (so a one-replica shard's
// drain never hangs), and unhealthy pods never block a drain.
func TestPDBsLetDrainsProceedOneAtATime(t *testing.T) {
	for _, replicas := range []int32{1, 2, 3} {
		p := testProfile()
		p.Spec.ReplicasPerShard, p.Spec.FrontReplicas = replicas, replicas
		d, err := BuildDesired(p, testOpts, testCerts(t, p), Monitoring{})
		if err != nil {
			t.Fatal(err)
		}
		pdbs := append(d.ShardPDBs, d.FrontPDB)
		for i, pdb := range pdbs {
			if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil ||
				pdb.Spec.UnhealthyPodEvictionPolicy == nil || *pdb.Spec.UnhealthyPodEvictionPolicy != "AlwaysAllow" {
				t.Errorf("replicas %d: PDB %s: %+v", replicas, pdb.Name, pdb.Spec)
			}
			// Each budget selects its own set's pods only.
			sel, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			var tmpl corev1.PodTemplateSpec
			if i < len(d.Shards) {
				tmpl = d.Shards[i].Spec.Template
			} else {
				tmpl = d.Front.Spec.Template
			}
			if !sel.Matches(labels.Set(tmpl.Labels)) {
				t.Errorf("PDB %s does not select its pods", pdb.Name)
			}
			for j, s := range d.Shards {
				if j != i && sel.Matches(labels.Set(s.Spec.Template.Labels)) {
					t.Errorf("PDB %s also selects %s's pods", pdb.Name, s.Name)
				}
			}
		}
	}
}

package kubectl

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/cachetier/cachetier/hack/sampledata"
)

// describeNS holds the objects TestDescribe describes.
const describeNS = "describe"

// describeFixture creates, once, a namespace with a quota and a limit
// range, and in it a pod, a configmap, a secret and a widget, each with
// events that name it (by kind, name, namespace and UID, as a controller
// records them), plus events that must not be found: same name but another
// UID or kind. Returns the UIDs by kind.
func describeFixture(t *testing.T) map[string]types.UID {
	t.Helper()
	if describeUIDs != nil { // made by an earlier test (or -count run)
		return describeUIDs
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: describeNS, Labels: map[string]string{"team": "d"}, Annotations: map[string]string{"owner": "describe-test"},
	}}, metav1.CreateOptions{})
	noErr(t, err)
	_, err = kc.CoreV1().ResourceQuotas(describeNS).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "quota"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("20"), corev1.ResourceConfigMaps: resource.MustParse("30")}},
	}, metav1.CreateOptions{})
	noErr(t, err)
	_, err = kc.CoreV1().LimitRanges(describeNS).Create(ctx, &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "limits"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type:           corev1.LimitTypeContainer,
			Default:        corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			DefaultRequest: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		}}},
	}, metav1.CreateOptions{})
	noErr(t, err)
	pod, err := kc.CoreV1().Pods(describeNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"note": "described"}},
		Spec: corev1.PodSpec{
			NodeName:       "node-1",
			InitContainers: []corev1.Container{{Name: "init", Image: "registry.example/init:1", Command: []string{"sh", "-c", "true"}}},
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/app:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080, Name: "http"}},
				Env:          []corev1.EnvVar{{Name: "MODE", Value: "test"}, {Name: "FROM_CM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "mode"}}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/cfg"}},
			}},
			Volumes:     []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}},
			Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "web", Effect: corev1.TaintEffectNoSchedule}},
		},
	}, metav1.CreateOptions{})
	noErr(t, err)
	cm, err := kc.CoreV1().ConfigMaps(describeNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings", Labels: map[string]string{"app": "web"}},
		Data:       map[string]string{"mode": "test", "config.yaml": "a: 1\nb: two\n"},
		BinaryData: map[string][]byte{"blob": {0, 1, 2, 3}},
	}, metav1.CreateOptions{})
	noErr(t, err)
	secret, err := kc.CoreV1().Secrets(describeNS).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Annotations: map[string]string{"rotated": "never"}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"password": []byte("hunter2"), "user": []byte("admin")},
	}, metav1.CreateOptions{})
	noErr(t, err)
	dyn := dynamic.NewForConfigOrDie(env.Admin)
	widget, err := dyn.Resource(sampledata.WidgetsGVR()).Namespace(describeNS).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.cachetier.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1", "labels": map[string]any{"app": "web"}},
		"spec":     map[string]any{"color": "red", "size": int64(3)},
	}}, metav1.CreateOptions{})
	noErr(t, err)

	// Events some hours old: their ages change by the minute at most, and
	// are normalized anyway.
	base := metav1.NewTime(time.Now().Add(-3 * time.Hour).Truncate(time.Second))
	later := metav1.NewTime(base.Add(40 * time.Minute))
	ref := func(kind, apiVersion, name string, uid types.UID) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: kind, APIVersion: apiVersion, Namespace: describeNS, Name: name, UID: uid}
	}
	n := 0
	event := func(involved corev1.ObjectReference, typ, reason, msg, component string, count int32, mutate ...func(*corev1.Event)) {
		t.Helper()
		n++
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%03d", involved.Name, n)},
			InvolvedObject: involved, Type: typ, Reason: reason, Message: msg,
			Source: corev1.EventSource{Component: component, Host: "node-1"}, Count: count,
			FirstTimestamp: base, LastTimestamp: base,
		}
		if count > 1 {
			ev.LastTimestamp = later
		}
		for _, m := range mutate {
			m(ev)
		}
		_, err := kc.CoreV1().Events(describeNS).Create(ctx, ev, metav1.CreateOptions{})
		noErr(t, err)
	}
	podRef := ref("Pod", "v1", "web", pod.UID)
	event(podRef, "Normal", "Scheduled", "Successfully assigned describe/web to node-1", "default-scheduler", 1)
	event(podRef, "Normal", "Pulled", "Container image \"registry.example/app:1\" already present on machine", "kubelet", 1, func(e *corev1.Event) {
		e.InvolvedObject.FieldPath = "spec.containers{app}"
		e.InvolvedObject.ResourceVersion = pod.ResourceVersion
	})
	event(podRef, "Warning", "BackOff", "Back-off restarting failed container app in pod web_describe", "kubelet", 7, func(e *corev1.Event) {
		e.InvolvedObject.FieldPath = "spec.containers{app}"
		e.ReportingController, e.ReportingInstance = "kubelet", "node-1"
	})
	event(ref("ConfigMap", "v1", "settings", cm.UID), "Normal", "Synced", "configuration loaded by web", "config-agent", 2)
	event(ref("Secret", "v1", "creds", secret.UID), "Normal", "Rotated", "nothing to rotate", "secret-agent", 1)
	event(ref("Widget", "example.cachetier.io/v1", "w1", widget.GetUID()), "Warning", "Oversized", "size 3 exceeds the budget of 2", "widget-controller", 3)
	event(ref("Widget", "example.cachetier.io/v1", "w1", widget.GetUID()), "Normal", "Painted", "color red applied", "widget-controller", 1)
	// Not found by describe: an earlier object of the same name, and an
	// object of another kind with the same name.
	event(ref("Pod", "v1", "web", "00000000-0000-0000-0000-000000000001"), "Normal", "Killing", "an earlier pod web", "kubelet", 1)
	event(ref("ConfigMap", "v1", "w1", "00000000-0000-0000-0000-000000000002"), "Normal", "Other", "a configmap named like the widget", "config-agent", 1)
	describeUIDs = map[string]types.UID{"Pod": pod.UID, "ConfigMap": cm.UID, "Secret": secret.UID, "Widget": widget.GetUID()}
	return describeUIDs
}

// describeUIDs are the fixture's UIDs once it exists.
var describeUIDs map[string]types.UID

// eventAge is duration.HumanDuration's output, alone or in the
// "(x7 over 3h)" form of repeated events.
var eventAge = regexp.MustCompile(`\b\d+(y|d|h|m|s)(\d+(d|h|m|s))?\b`)

// normalizeAges replaces the ages in the Events table of kubectl describe
// (and the padding the tab writer gives them): they depend on when kubectl
// ran. Nothing else is touched.
func normalizeAges(out string) string {
	lines := strings.Split(out, "\n")
	inEvents := false
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "Events:"):
			inEvents = true
		case inEvents && strings.HasPrefix(l, "  "):
			lines[i] = strings.Join(strings.Fields(eventAge.ReplaceAllString(l, "<age>")), " ")
		default:
			inEvents = false
		}
	}
	return strings.Join(lines, "\n")
}

// TestDescribe: kubectl describe through the tier prints what it prints
// against the apiserver — for pods, configmaps, secrets, namespaces (with
// their quotas and limit ranges) and a custom resource, with the events
// found by describe's involvedObject field selectors (paginated with
// --chunk-size) — directly, through the aggregator and through the fleet.
func TestDescribe(t *testing.T) {
	uids := describeFixture(t)
	cases := [][]string{
		{"describe", "pod", "web", "-n", describeNS},
		{"describe", "pods", "-n", describeNS},
		{"describe", "pod", "web", "-n", describeNS, "--chunk-size=1"},
		{"describe", "pod", "web", "-n", describeNS, "--show-events=false"},
		{"describe", "configmap", "settings", "-n", describeNS},
		{"describe", "configmap", "settings", "-n", describeNS, "--chunk-size=1"},
		{"describe", "secret", "creds", "-n", describeNS},
		{"describe", "namespace", describeNS},
		{"describe", "namespace", "ns-1"},
		{"describe", "namespaces", "-l", "team=d"},
		{"describe", "widget", "w1", "-n", describeNS},
		{"describe", "wg", "-n", describeNS, "--chunk-size=1"},
		{"describe", "widgets.example.cachetier.io", "-n", describeNS, "-l", "app=web"},
		{"describe", "pod", "pod-03", "-n", "ns-1"},
		{"describe", "configmaps", "-n", "ns-2", "-l", "app=a,tier=x"},
	}
	for path, kubeconfig := range map[string]string{"direct": env.TierKubeconfig, "aggregated": aggKubeconfig, "fleet": fleetKubeconfig} {
		t.Run(path, func(t *testing.T) {
			for _, args := range cases {
				t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
					want := normalizeAges(mustKubectl(t, env.CP.AdminKubeconfig, args...))
					got := normalizeAges(mustKubectl(t, kubeconfig, args...))
					if !strings.Contains(want, "Name:") {
						t.Fatalf("apiserver printed no description: %s", want)
					}
					if got != want {
						t.Fatalf("kubectl %s differs\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), clip(got), clip(want))
					}
				})
			}
		})
	}
	// The descriptions above must show the events (otherwise the event
	// search was not exercised), not the decoys, and the namespace's quota
	// and limit range.
	pod := mustKubectl(t, env.TierKubeconfig, "describe", "pod", "web", "-n", describeNS)
	for _, want := range []string{"Scheduled", "Back-off restarting failed container", "(x7 over"} {
		if !strings.Contains(pod, want) {
			t.Errorf("describe pod lacks %q:\n%s", want, pod)
		}
	}
	if strings.Contains(pod, "an earlier pod web") {
		t.Errorf("describe pod shows the event of another pod with the same name:\n%s", pod)
	}
	if ns := mustKubectl(t, env.TierKubeconfig, "describe", "namespace", describeNS); !strings.Contains(ns, "Default Request") || !strings.Contains(ns, "Name:     quota") {
		t.Errorf("describe namespace lacks the quota or the limit range:\n%s", ns)
	}

	// The event search went to the tier, with describe's field selector,
	// one event per page (kubectl -v=6 logs each request), in as many pages
	// as the apiserver answers.
	pages := func(kubeconfig, server string) [][]string {
		r := kubectl(t, kubeconfig, "describe", "pod", "web", "-n", describeNS, "--chunk-size=1", "-v=6")
		if r.err != nil {
			t.Fatalf("kubectl: %s", r)
		}
		// kubectl builds the selector from a map: its terms come in any order.
		sel := regexp.MustCompile(`url="` + regexp.QuoteMeta(server) + `/api/v1/namespaces/describe/events\?(continue=[^&"]+&)?fieldSelector=([^&"]+)&limit=1" status="200 OK"`)
		want := []string{"involvedObject.name=web", "involvedObject.namespace=describe", "involvedObject.uid=" + string(uids["Pod"])}
		p := sel.FindAllStringSubmatch(r.stderr, -1)
		for _, m := range p {
			terms, err := url.QueryUnescape(m[2])
			noErr(t, err)
			got := strings.Split(terms, ",")
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Fatalf("describe's event search selector %v, want %v", got, want)
			}
		}
		if len(p) < 3 || p[0][1] != "" {
			t.Fatalf("describe's event search: %d page requests to %s, want >= 3 (the first not continued):\n%s", len(p), server, clip(r.stderr))
		}
		return p
	}
	tierPages, apiPages := pages(env.TierKubeconfig, env.TierURL), pages(env.CP.AdminKubeconfig, env.Admin.Host)
	if len(tierPages) != len(apiPages) {
		t.Errorf("describe's event search: %d pages from the tier, %d from the apiserver", len(tierPages), len(apiPages))
	}
}

// TestEventFieldSelectors: every field selector the apiserver supports on
// core/v1 events (involvedObject.*, reason, reportingComponent, source,
// type, metadata.*), with = and !=, selects the same events through the
// tier as from the apiserver.
func TestEventFieldSelectors(t *testing.T) {
	podUID := describeFixture(t)["Pod"]
	pod, err := kubernetes.NewForConfigOrDie(env.Admin).CoreV1().Pods(describeNS).Get(context.Background(), "web", metav1.GetOptions{})
	noErr(t, err)
	for _, sel := range []string{
		"involvedObject.kind=Pod",
		"involvedObject.kind!=Pod",
		"involvedObject.namespace=" + describeNS,
		"involvedObject.name=web",
		"involvedObject.name=w1,involvedObject.kind=Widget",
		"involvedObject.uid=" + string(podUID),
		"involvedObject.uid!=" + string(podUID),
		"involvedObject.apiVersion=example.cachetier.io/v1",
		"involvedObject.resourceVersion=" + pod.ResourceVersion,
		"involvedObject.fieldPath=spec.containers{app}",
		"reason=BackOff",
		"reason!=Scheduled,type=Normal",
		"reportingComponent=kubelet",
		"reportingComponent=",
		"source=kubelet",
		"source!=kubelet",
		"type=Warning",
		"metadata.name=web.001",
		"metadata.namespace=" + describeNS,
	} {
		t.Run(sel, func(t *testing.T) {
			args := []string{"get", "events", "-n", describeNS, "--field-selector", sel}
			for _, kubeconfig := range []string{env.TierKubeconfig, aggKubeconfig, fleetKubeconfig} {
				compareJSON(t, kubeconfig, args...)
			}
		})
	}
	t.Run("all namespaces", func(t *testing.T) {
		for _, kubeconfig := range []string{env.TierKubeconfig, aggKubeconfig, fleetKubeconfig} {
			compareJSON(t, kubeconfig, "get", "events", "-A", "--field-selector", "involvedObject.kind=Pod,type=Normal")
		}
	})
	t.Run("unsupported field", func(t *testing.T) {
		args := []string{"get", "events", "-n", describeNS, "--field-selector", "regarding.name=web"}
		want := kubectl(t, env.CP.AdminKubeconfig, args...)
		got := kubectl(t, env.TierKubeconfig, args...)
		if want.err == nil || got.err == nil || got.stderr != want.stderr {
			t.Fatalf("tier:\n%s\napiserver:\n%s", got, want)
		}
	})
}

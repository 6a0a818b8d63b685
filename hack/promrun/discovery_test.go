package promrun

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// One target per address (ready and not ready) and port, with the labels
// Kubernetes SD's endpoints role gives: the Service's labels, the pod and
// the container whose port it is.
func TestEndpointsGroups(t *testing.T) {
	svc := corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "fleet-shards", Namespace: "ns", Labels: map[string]string{"app.kubernetes.io/instance": "fleet"}}}
	pod := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-shard-0-0", Namespace: "ns"},
		Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "cache-server", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}, {Name: "https", ContainerPort: 8443}}}}},
	}
	ep := corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "fleet-shards", Namespace: "ns"},
		Subsets: []corev1.EndpointSubset{{
			Addresses:         []corev1.EndpointAddress{{IP: "100.64.1.5", TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "fleet-shard-0-0"}}},
			NotReadyAddresses: []corev1.EndpointAddress{{IP: "100.64.1.6"}},
			Ports:             []corev1.EndpointPort{{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}},
		}},
	}
	groups := EndpointsGroups([]corev1.Service{svc}, []corev1.Endpoints{ep}, []corev1.Pod{pod})
	if len(groups) != 2 {
		t.Fatalf("%d groups: %+v", len(groups), groups)
	}
	g := groups[0]
	want := map[string]string{
		"__meta_kubernetes_namespace":                                "ns",
		"__meta_kubernetes_service_name":                             "fleet-shards",
		"__meta_kubernetes_service_label_app_kubernetes_io_instance": "fleet",
		"__meta_kubernetes_endpoint_port_name":                       "metrics",
		"__meta_kubernetes_endpoint_ready":                           "true",
		"__meta_kubernetes_pod_name":                                 "fleet-shard-0-0",
		"__meta_kubernetes_pod_container_name":                       "cache-server",
	}
	if g.Targets[0] != "100.64.1.5:9090" {
		t.Errorf("target %v", g.Targets)
	}
	for k, v := range want {
		if g.Labels[k] != v {
			t.Errorf("%s = %q, want %q", k, g.Labels[k], v)
		}
	}
	if groups[1].Targets[0] != "100.64.1.6:9090" || groups[1].Labels["__meta_kubernetes_endpoint_ready"] != "false" || groups[1].Labels["__meta_kubernetes_pod_name"] != "" {
		t.Errorf("not-ready address: %+v", groups[1])
	}
}

package promrun

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Debian's prometheus 2.42 is built without Kubernetes service discovery
// (kubernetes_sd_configs is not a field it knows). Discovery serves the
// same discovery through Prometheus' HTTP service discovery
// (http_sd_configs): at each refresh it lists a namespace's Services,
// Endpoints and Pods from the apiserver and answers with the targets and
// __meta_kubernetes_* labels Kubernetes SD's "endpoints" role produces, so
// the relabelling the Prometheus Operator generates applies unchanged.
type Discovery struct {
	// URL is the base of the discovery endpoint: URL+"/"+namespace.
	URL    string
	client kubernetes.Interface
	srv    *http.Server
}

// TargetGroup is one entry of an HTTP SD answer.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// ServeDiscovery listens on a free loopback port.
func ServeDiscovery(client kubernetes.Interface) (*Discovery, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &Discovery{URL: "http://" + l.Addr().String(), client: client}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{namespace}", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		groups, err := d.Groups(ctx, r.PathValue("namespace"))
		if err != nil {
			// Prometheus keeps the last good targets on an error.
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(groups)
	})
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.srv.Serve(l) }()
	return d, nil
}

// Close stops serving.
func (d *Discovery) Close() error { return d.srv.Close() }

// SDConfig is the http_sd_configs entry for a namespace.
func (d *Discovery) SDConfig(namespace string) map[string]any {
	return map[string]any{"url": d.URL + "/" + namespace, "refresh_interval": "5s"}
}

// Groups are the targets of every Endpoints object of namespace: one per
// address (ready or not) and port, labelled as Kubernetes SD labels them.
func (d *Discovery) Groups(ctx context.Context, namespace string) ([]TargetGroup, error) {
	services, err := d.client.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	endpoints, err := d.client.CoreV1().Endpoints(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := d.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return EndpointsGroups(services.Items, endpoints.Items, pods.Items), nil
}

// EndpointsGroups is the pure part of Groups.
func EndpointsGroups(services []corev1.Service, endpoints []corev1.Endpoints, pods []corev1.Pod) []TargetGroup {
	svcByName := map[string]*corev1.Service{}
	for i := range services {
		svcByName[services[i].Name] = &services[i]
	}
	podByName := map[string]*corev1.Pod{}
	for i := range pods {
		podByName[pods[i].Name] = &pods[i]
	}
	groups := []TargetGroup{}
	for _, ep := range endpoints {
		svc := svcByName[ep.Name]
		for _, subset := range ep.Subsets {
			for _, addrs := range []struct {
				list  []corev1.EndpointAddress
				ready string
			}{{subset.Addresses, "true"}, {subset.NotReadyAddresses, "false"}} {
				for _, a := range addrs.list {
					for _, port := range subset.Ports {
						labels := map[string]string{
							"__meta_kubernetes_namespace":                    ep.Namespace,
							"__meta_kubernetes_endpoints_name":               ep.Name,
							"__meta_kubernetes_endpoint_port_name":           port.Name,
							"__meta_kubernetes_endpoint_port_protocol":       string(port.Protocol),
							"__meta_kubernetes_endpoint_ready":               addrs.ready,
							"__meta_kubernetes_endpoint_address_target_kind": "",
						}
						if svc != nil {
							labels["__meta_kubernetes_service_name"] = svc.Name
							for k, v := range svc.Labels {
								labels["__meta_kubernetes_service_label_"+sanitize(k)] = v
								labels["__meta_kubernetes_service_labelpresent_"+sanitize(k)] = "true"
							}
						}
						if a.TargetRef != nil && a.TargetRef.Kind == "Pod" {
							labels["__meta_kubernetes_endpoint_address_target_kind"] = "Pod"
							labels["__meta_kubernetes_endpoint_address_target_name"] = a.TargetRef.Name
							if pod := podByName[a.TargetRef.Name]; pod != nil {
								labels["__meta_kubernetes_pod_name"] = pod.Name
								labels["__meta_kubernetes_pod_ip"] = pod.Status.PodIP
								labels["__meta_kubernetes_pod_node_name"] = pod.Spec.NodeName
								for k, v := range pod.Labels {
									labels["__meta_kubernetes_pod_label_"+sanitize(k)] = v
								}
								for _, c := range pod.Spec.Containers {
									for _, cp := range c.Ports {
										if cp.ContainerPort == port.Port {
											labels["__meta_kubernetes_pod_container_name"] = c.Name
											labels["__meta_kubernetes_pod_container_port_name"] = cp.Name
										}
									}
								}
							}
						}
						groups = append(groups, TargetGroup{
							Targets: []string{net.JoinHostPort(a.IP, strconv.Itoa(int(port.Port)))},
							Labels:  labels,
						})
					}
				}
			}
		}
	}
	return groups
}

// String describes the discovery for logs.
func (d *Discovery) String() string { return fmt.Sprintf("HTTP service discovery at %s", d.URL) }

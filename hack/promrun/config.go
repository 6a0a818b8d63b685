package promrun

import (
	"fmt"
	"sort"

	"sigs.k8s.io/yaml"
)

// ServiceMonitor is what a Prometheus Operator ServiceMonitor (one
// endpoint) asks for, read from the object; Job turns it into the scrape
// configuration the Prometheus Operator would generate, with
// Kubernetes service discovery of the endpoints.
type ServiceMonitor struct {
	Name, Namespace string
	// MatchLabels selects the Services.
	MatchLabels map[string]string
	// Port is the Service port's name; Path, Scheme and Interval as in the
	// endpoint ("" for Prometheus' defaults).
	Port, Path, Scheme, Interval string
	// InsecureSkipVerify and BearerTokenFile as in the endpoint. The token
	// file is where the scraping Prometheus finds its token.
	InsecureSkipVerify bool
	BearerTokenFile    string
}

// FromObject reads a ServiceMonitor object (unstructured content) with one
// endpoint. tokenFile replaces the endpoint's bearerTokenFile, a path
// inside a Prometheus pod.
func FromObject(obj map[string]any, tokenFile string) (ServiceMonitor, error) {
	meta, _ := obj["metadata"].(map[string]any)
	spec, _ := obj["spec"].(map[string]any)
	sel, _ := spec["selector"].(map[string]any)
	ml, _ := sel["matchLabels"].(map[string]any)
	eps, _ := spec["endpoints"].([]any)
	if meta == nil || len(ml) == 0 || len(eps) != 1 {
		return ServiceMonitor{}, fmt.Errorf("ServiceMonitor wants metadata, spec.selector.matchLabels and one endpoint: %v", obj)
	}
	ep, _ := eps[0].(map[string]any)
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	sm := ServiceMonitor{
		Name: str(meta, "name"), Namespace: str(meta, "namespace"), MatchLabels: map[string]string{},
		Port: str(ep, "port"), Path: str(ep, "path"), Scheme: str(ep, "scheme"), Interval: str(ep, "interval"),
	}
	for k, v := range ml {
		sm.MatchLabels[k] = fmt.Sprint(v)
	}
	if tls, ok := ep["tlsConfig"].(map[string]any); ok {
		sm.InsecureSkipVerify, _ = tls["insecureSkipVerify"].(bool)
	}
	if str(ep, "bearerTokenFile") != "" {
		sm.BearerTokenFile = tokenFile
	}
	if sm.Port == "" {
		return ServiceMonitor{}, fmt.Errorf("ServiceMonitor %s/%s: endpoint without a port name", sm.Namespace, sm.Name)
	}
	return sm, nil
}

// Job is the scrape configuration for sm: endpoints discovered in its
// namespace by sd (an SD configuration: Discovery.SDConfig), kept when the Service's
// labels match and the port is sm.Port, with the target labels the
// Prometheus Operator sets (job is the Service's name, as the alert rules
// and dashboards expect; namespace, service, pod, container, endpoint).
func (sm ServiceMonitor) Job(sd map[string]any) map[string]any {
	keys := make([]string, 0, len(sm.MatchLabels))
	for k := range sm.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var relabel []any
	for _, k := range keys {
		relabel = append(relabel, map[string]any{
			"action": "keep", "source_labels": []string{"__meta_kubernetes_service_label_" + sanitize(k)}, "regex": sm.MatchLabels[k],
		})
	}
	relabel = append(relabel,
		map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_endpoint_port_name"}, "regex": sm.Port},
		map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "service"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
		map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "job"},
		map[string]any{"target_label": "endpoint", "replacement": sm.Port},
	)
	job := map[string]any{
		"job_name":        fmt.Sprintf("serviceMonitor/%s/%s/0", sm.Namespace, sm.Name),
		"http_sd_configs": []any{sd},
		"relabel_configs": relabel,
	}
	if sm.Path != "" {
		job["metrics_path"] = sm.Path
	}
	if sm.Scheme != "" {
		job["scheme"] = sm.Scheme
	}
	if sm.Interval != "" {
		job["scrape_interval"] = sm.Interval
	}
	if sm.InsecureSkipVerify {
		job["tls_config"] = map[string]any{"insecure_skip_verify": true}
	}
	if sm.BearerTokenFile != "" {
		job["authorization"] = map[string]any{"credentials_file": sm.BearerTokenFile}
	}
	return job
}

// sanitize turns a label name into Prometheus' meta label form.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Config is a Prometheus configuration: global intervals, rule files and
// scrape jobs.
func Config(scrapeInterval, evaluationInterval string, ruleFiles []string, jobs []map[string]any) ([]byte, error) {
	sc := make([]any, len(jobs))
	for i, j := range jobs {
		sc[i] = j
	}
	return yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval": scrapeInterval, "evaluation_interval": evaluationInterval,
		},
		"rule_files":     ruleFiles,
		"scrape_configs": sc,
	})
}

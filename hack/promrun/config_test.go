package promrun

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The scrape jobs rendered from a ServiceMonitor object pass promtool's
// configuration check, and carry the Prometheus Operator's target labels.
func TestConfigFromServiceMonitor(t *testing.T) {
	obj := map[string]any{
		"metadata": map[string]any{"name": "m", "namespace": "ns"},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "cachetier", "app.kubernetes.io/component": "manager"}},
			"endpoints": []any{map[string]any{
				"port": "https", "path": "/metrics", "scheme": "https", "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
				"tlsConfig": map[string]any{"insecureSkipVerify": true},
			}},
		},
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	sm, err := FromObject(obj, token)
	if err != nil {
		t.Fatal(err)
	}
	if sm.BearerTokenFile != token || !sm.InsecureSkipVerify || sm.Scheme != "https" || sm.Port != "https" {
		t.Fatalf("%+v", sm)
	}
	cfg, err := Config("30s", "15s", nil, []map[string]any{sm.Job(map[string]any{"url": "http://127.0.0.1:1/ns", "refresh_interval": "5s"})})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"job_name: serviceMonitor/ns/m/0",
		"http_sd_configs:",
		"__meta_kubernetes_service_label_app_kubernetes_io_component",
		"target_label: job",
		"credentials_file: " + token,
	} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	if _, err := FromObject(map[string]any{"metadata": map[string]any{}}, token); err == nil {
		t.Error("a ServiceMonitor without selector and endpoints: want an error")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool: %v (make test-deps installs Debian's prometheus package)", err)
	}
	// promtool checks that the referenced files exist.
	for _, f := range []string{token} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", "--syntax-only", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s\n%s", err, out, cfg)
	}
}

package auth

import (
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestClientForLimits: the reviews' client gets the delegated-auth limits
// and leaves the caller's config alone.
func TestClientForLimits(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	c, err := ClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rl := c.(*kubernetes.Clientset).AuthorizationV1().RESTClient().(*rest.RESTClient).GetRateLimiter()
	if got := rl.QPS(); got != 200 {
		t.Errorf("QPS %v, want 200", got)
	}
	if cfg.QPS != 0 || cfg.Burst != 0 {
		t.Errorf("caller's config changed: QPS %v burst %d", cfg.QPS, cfg.Burst)
	}
}

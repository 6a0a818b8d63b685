package install

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	cachev1alpha1 "github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/hack/nodeinstall"
)

var settled = nodeinstall.Settled

func (e *env) profile(ctx context.Context) (*cachev1alpha1.CacheProfile, error) {
	return e.in.Profile(ctx)
}

// patchProfile merge-patches the profile's spec.
func (e *env) patchProfile(t *testing.T, spec map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"spec": spec})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := dynamic.NewForConfigOrDie(e.admin).Resource(nodeinstall.ProfilesGVR).Patch(ctx, profileName, "application/merge-patch+json", body, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch profile %s: %v", body, err)
	}
}

// waitProfile waits until cond holds for the profile, failing the test at
// once when a fleet pod cannot start (see nodeinstall.WaitProfile).
func (e *env) waitProfile(t *testing.T, what string, timeout time.Duration, cond func(*cachev1alpha1.CacheProfile) (string, bool)) *cachev1alpha1.CacheProfile {
	t.Helper()
	p, err := e.in.WaitProfile(context.Background(), what, timeout, cond)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) diagnose() string { return e.in.Diagnose() }

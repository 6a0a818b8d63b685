// Package watch tests WATCH and watch-list served by the tier (standalone,
// and a fleet of two shards of two replicas each behind a front)
// against a real kube-apiserver: raw streams compared with the apiserver's,
// client-go informers (typed, dynamic, metadata; WatchListClient on and
// off), kubectl get -w, controller-runtime, and a tier restart.
package watch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/api/v1alpha1"
	"github.com/cachetier/cachetier/cache-server/internal/tiertest"
)

// env is the tier under test (see forEachTier): standalone, or the fleet
// of two shards and a front that runs next to it on the same apiserver.
var env, standalone, fleet *tiertest.Env

const namespaces = 4

func TestMain(m *testing.M) {
	// client-go reads KUBE_WATCHLIST_INCONSISTENCY_DETECTOR once, at
	// process start: re-run the test binary with it set.
	if os.Getenv("KUBE_WATCHLIST_INCONSISTENCY_DETECTOR") == "" {
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), "KUBE_WATCHLIST_INCONSISTENCY_DETECTOR=true")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				os.Exit(ee.ExitCode())
			}
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	e, err := tiertest.Start(context.Background(), tiertest.Options{
		ProfileName: "watch", Spec: profile(), ServiceClusterIPRange: "127.78.0.0/24", Seed: seed,
		FleetShards: 2, FleetReplicas: 2,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/watch setup:", err)
		os.Exit(1)
	}
	env, standalone, fleet = e, e, e.Fleet()
	code := m.Run()
	e.Stop()
	os.Exit(code)
}

func profile() v1alpha1.CacheProfileSpec {
	return v1alpha1.CacheProfileSpec{
		HashShards: 4,
		Resources: []v1alpha1.CachedResource{
			{Version: "v1", Resource: "configmaps"},
			{Version: "v1", Resource: "namespaces"},
		},
	}
}

func nsName(i int) string { return fmt.Sprintf("w-%d", i) }

func seed(ctx context.Context, admin *rest.Config) error {
	kc, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return err
	}
	for i := range namespaces {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i)}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		for j := range 20 {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("seed-%02d", j), Namespace: nsName(i),
				Labels: map[string]string{"app": []string{"a", "b"}[j%2]}}, Data: map[string]string{"v": "0"}}
			if _, err := kc.CoreV1().ConfigMaps(nsName(i)).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// forEachTier runs test against the standalone tier and against the fleet
// (tests in this package do not run in parallel).
func forEachTier(t *testing.T, test func(*testing.T)) {
	defer func() { env = standalone }()
	for _, tier := range []struct {
		name string
		env  *tiertest.Env
	}{{"standalone", standalone}, {"fleet", fleet}} {
		env = tier.env
		t.Run(tier.name, test)
	}
}

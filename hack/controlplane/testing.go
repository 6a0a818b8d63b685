package controlplane

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// StartForTest starts a control plane that is stopped when the test ends.
// Missing binaries fail the test rather than skip it: `make test` builds
// them first, so a skip would only hide a broken setup.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.Log == nil {
		opts.Log = testWriter{t}
	}
	if opts.ServiceClusterIPRange == "" {
		// Test packages run in parallel, each with its own control plane, and
		// aggregated servers listen on ClusterIPs: give each its own range.
		opts.ServiceClusterIPRange = fmt.Sprintf("127.%d.%d.0/24", 16+rand.IntN(230), rand.IntN(256))
	}
	cp, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

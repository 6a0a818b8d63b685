package nodeinstall

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// PodMemory reads each pod's working-set memory in namespace from the
// kubelets' summary API (through the apiserver's node proxy), as `kubectl
// top` would from metrics-server: every running node's pods.
func (in *Installer) PodMemory(ctx context.Context, namespace string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, n := range in.Cluster.Nodes {
		if n.Down() {
			continue
		}
		raw, err := in.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "stats", "summary").DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Name, err)
		}
		var summary struct {
			Pods []struct {
				PodRef struct{ Name, Namespace string } `json:"podRef"`
				Memory *struct {
					WorkingSetBytes *uint64 `json:"workingSetBytes"`
				} `json:"memory"`
			} `json:"pods"`
		}
		if err := json.Unmarshal(raw, &summary); err != nil {
			return nil, fmt.Errorf("%s's kubelet stats summary: %w", n.Name, err)
		}
		for _, p := range summary.Pods {
			if p.PodRef.Namespace == namespace && p.Memory != nil && p.Memory.WorkingSetBytes != nil {
				out[p.PodRef.Name] = *p.Memory.WorkingSetBytes
			}
		}
	}
	return out, nil
}

// FormatMemory prints pod memory a line per pod, by name.
func FormatMemory(m map[string]uint64) string {
	var names []string
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %-40s %6.1f MiB\n", n, float64(m[n])/(1<<20))
	}
	return b.String()
}

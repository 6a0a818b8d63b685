package install

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/e2e/internal/clients"
)

// items parses `kubectl ... -o json` into its items by namespace/name.
func items(t *testing.T, out string) (keys []string, byKey map[string]json.RawMessage) {
	t.Helper()
	var list struct {
		Kind  string            `json:"kind"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("kubectl output is not a JSON list: %v\n%s", err, clip(out))
	}
	byKey = map[string]json.RawMessage{}
	for _, raw := range list.Items {
		var m struct {
			Metadata struct{ Namespace, Name string } `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		k := m.Metadata.Namespace + "/" + m.Metadata.Name
		keys = append(keys, k)
		byKey[k] = raw
	}
	return keys, byKey
}

// compareJSON runs `kubectl <args> -o json` against the apiserver, the tier,
// and the apiserver again. A consistent read from the tier is at least as
// fresh as the first apiserver answer and not fresher than the second, so
// when those two agree the tier must give the same items in the same order,
// object for object; when they differ (the kubelet updated a pod in
// between) the comparison is repeated.
func (e *env) compareJSON(t *testing.T, apiKubeconfig, tierKubeconfig string, args ...string) int {
	t.Helper()
	return e.compareJSONAs(t, apiKubeconfig, tierKubeconfig, args, args)
}

// compareJSONAs is compareJSON with different arguments for the apiserver,
// for what the profile itself filters (its labelSelector).
func (e *env) compareJSONAs(t *testing.T, apiKubeconfig, tierKubeconfig string, apiArgs, tierArgs []string) int {
	t.Helper()
	args := append(append([]string{}, tierArgs...), "-o", "json")
	apiArgs = append(append([]string{}, apiArgs...), "-o", "json")
	for attempt := 0; ; attempt++ {
		before := e.mustKubectl(t, apiKubeconfig, apiArgs...)
		tier := e.mustKubectl(t, tierKubeconfig, args...)
		after := e.mustKubectl(t, apiKubeconfig, apiArgs...)
		wantKeys, want := items(t, before)
		afterKeys, afterItems := items(t, after)
		if !reflect.DeepEqual(wantKeys, afterKeys) || !sameItems(want, afterItems) {
			if attempt == 10 {
				t.Fatalf("kubectl %s: the apiserver's answer never held still over 10 attempts", strings.Join(args, " "))
			}
			time.Sleep(time.Second)
			continue
		}
		gotKeys, got := items(t, tier)
		if len(wantKeys) == 0 {
			t.Fatalf("kubectl %s: the apiserver returned nothing; the case tests nothing", strings.Join(args, " "))
		}
		if !reflect.DeepEqual(gotKeys, wantKeys) {
			t.Fatalf("kubectl %s: items differ\ntier (%d):      %v\napiserver (%d): %v", strings.Join(args, " "), len(gotKeys), gotKeys, len(wantKeys), wantKeys)
		}
		for _, k := range wantKeys {
			if !jsonEqual(got[k], want[k]) {
				t.Fatalf("kubectl %s: %s differs\ntier:\n%s\napiserver:\n%s", strings.Join(args, " "), k, got[k], want[k])
			}
		}
		return len(wantKeys)
	}
}

func sameItems(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !jsonEqual(v, b[k]) {
			return false
		}
	}
	return true
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// startReaders starts informers through the tier (clients.Informers).
func startReaders(t *testing.T, tier *rest.Config) *clients.Informers {
	return clients.StartInformers(t, tier)
}

// waitSame polls until the informers hold exactly what the apiserver holds,
// key by key and resourceVersion by resourceVersion.
func (e *env) waitSame(t *testing.T, r *clients.Informers, timeout time.Duration) {
	t.Helper()
	r.WaitSame(t, e.kc, cachedNamespaces, timeout)
}

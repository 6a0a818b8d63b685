package catalog

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cachetier/cachetier/cache-server/internal/fields"
)

func TestFieldIndexes(t *testing.T) {
	pods, err := fields.New(fields.Spec{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod", Namespaced: true})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		profile []string
		want    []string
		fails   bool
	}{
		{nil, []string{"spec.nodeName"}, false},
		{[]string{"spec.nodeName"}, []string{"spec.nodeName"}, false},
		{[]string{"status.phase", "status.phase"}, []string{"status.phase", "spec.nodeName"}, false},
		{[]string{"spec.host"}, nil, true},
		{[]string{"spec.nope"}, nil, true},
	}
	for _, c := range cases {
		got, err := fieldIndexes(c.profile, pods)
		if (err != nil) != c.fails {
			t.Errorf("%v: err %v, want failure %v", c.profile, err, c.fails)
			continue
		}
		if !c.fails && !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, want %v", c.profile, got, c.want)
		}
	}
}

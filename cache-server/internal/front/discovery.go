package front

import (
	"net/http"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// discovery holds the tier's discovery documents, built once from the
// catalog: exactly the cached resources, each with verbs get, list, watch.
type discovery struct {
	coreVersions []string                           // "/api"
	groups       metav1.APIGroupList                // "/apis"
	resources    map[string]*metav1.APIResourceList // by group/version path, e.g. "api/v1", "apis/apps/v1"
}

func newDiscovery(resources []*resource) *discovery {
	d := &discovery{resources: map[string]*metav1.APIResourceList{}}
	groupVersions := map[string][]string{}
	for _, e := range resources {
		gv := e.GVR.GroupVersion()
		path := gvPath(gv)
		l, ok := d.resources[path]
		if !ok {
			l = &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv.String()}
			d.resources[path] = l
			if gv.Group == "" {
				d.coreVersions = append(d.coreVersions, gv.Version)
			} else {
				groupVersions[gv.Group] = append(groupVersions[gv.Group], gv.Version)
			}
		}
		l.APIResources = append(l.APIResources, e.APIResource)
	}
	for _, l := range d.resources {
		sort.Slice(l.APIResources, func(i, j int) bool { return l.APIResources[i].Name < l.APIResources[j].Name })
	}
	d.groups = metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
	names := make([]string, 0, len(groupVersions))
	for g := range groupVersions {
		names = append(names, g)
	}
	sort.Strings(names)
	for _, g := range names {
		var vs []metav1.GroupVersionForDiscovery
		for _, v := range groupVersions[g] {
			vs = append(vs, metav1.GroupVersionForDiscovery{GroupVersion: g + "/" + v, Version: v})
		}
		d.groups.Groups = append(d.groups.Groups, metav1.APIGroup{Name: g, Versions: vs, PreferredVersion: vs[0]})
	}
	return d
}

func gvPath(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

// serve answers a discovery path; ok is false when path is not one.
func (d *discovery) serve(w http.ResponseWriter, path string) (code int, ok bool) {
	p := strings.Trim(path, "/")
	switch {
	case p == "api":
		writeJSON(w, http.StatusOK, metav1.APIVersions{
			TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: append([]string{}, d.coreVersions...),
			// The tier is reached at an address of its own, not the
			// apiserver's, so it has no server address to advertise.
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{},
		})
		return http.StatusOK, true
	case p == "apis":
		writeJSON(w, http.StatusOK, d.groups)
		return http.StatusOK, true
	}
	if l, found := d.resources[p]; found {
		writeJSON(w, http.StatusOK, l)
		return http.StatusOK, true
	}
	if strings.HasPrefix(p, "apis/") && strings.Count(p, "/") == 1 {
		g := strings.TrimPrefix(p, "apis/")
		for _, grp := range d.groups.Groups {
			if grp.Name == g {
				out := grp
				out.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
				writeJSON(w, http.StatusOK, out)
				return http.StatusOK, true
			}
		}
	}
	return 0, false
}

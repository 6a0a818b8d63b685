package aggpath

import (
	"strings"
	"testing"
)

func TestFor(t *testing.T) {
	p := For("fleet")
	if p.Group != "fleet.cache.cachetier.io" || p.Root != "/apis/fleet.cache.cachetier.io/v1alpha1" ||
		p.Prefix != "/apis/fleet.cache.cachetier.io/v1alpha1/watch" || p.GroupVersion() != "fleet.cache.cachetier.io/v1alpha1" {
		t.Fatalf("%+v %s", p, p.GroupVersion())
	}
	for in, want := range map[string]string{
		"https://api.example.com:6443":   "https://api.example.com:6443/apis/fleet.cache.cachetier.io/v1alpha1/watch",
		"https://api.example.com:6443/":  "https://api.example.com:6443/apis/fleet.cache.cachetier.io/v1alpha1/watch",
		"https://api.example.com:6443//": "https://api.example.com:6443/apis/fleet.cache.cachetier.io/v1alpha1/watch",
		"https://lb.example.com/k8s/":    "https://lb.example.com/k8s/apis/fleet.cache.cachetier.io/v1alpha1/watch",
	} {
		if got := p.ServerURL(in); got != want {
			t.Errorf("ServerURL(%q) = %q, want %q", in, got, want)
		}
	}
	if got := p.RootServerURL("https://a:6443/"); got != "https://a:6443/apis/fleet.cache.cachetier.io/v1alpha1" {
		t.Errorf("RootServerURL: %q", got)
	}
}

func TestStrip(t *testing.T) {
	p := For("p")
	const root, prefix = "/apis/p.cache.cachetier.io/v1alpha1", "/apis/p.cache.cachetier.io/v1alpha1/watch"
	for _, c := range []struct{ path, rest, under string }{
		{prefix + "/api/v1/pods", "/api/v1/pods", prefix},
		{prefix + "/api/v1/namespaces/x/pods/y", "/api/v1/namespaces/x/pods/y", prefix},
		{prefix + "/apis", "/apis", prefix},
		{prefix + "/openapi/v3/api/v1", "/openapi/v3/api/v1", prefix},
		{prefix + "/version", "/version", prefix},
		{prefix + "/", "/", prefix},
		// A watch path below Prefix keeps its own "watch" segment.
		{prefix + "/api/v1/watch/pods", "/api/v1/watch/pods", prefix},
		{prefix + "/watch/api", "/watch/api", prefix},
		{root + "/api/v1/pods", "/api/v1/pods", root},
		{root, "", root},
		{root + "/", "/", root},
		// Prefix alone is /watch below Root (not served).
		{prefix, "/watch", root},
		{root + "/watchers/x", "/watchers/x", root},
		{root + "x/api", root + "x/api", ""},
		{prefix + "x/api", "/watchx/api", root},
		{"/api/v1/pods", "/api/v1/pods", ""},
		{"/apis/q.cache.cachetier.io/v1alpha1/watch/api", "/apis/q.cache.cachetier.io/v1alpha1/watch/api", ""},
		{"/apis/p.cache.cachetier.io/v1/api", "/apis/p.cache.cachetier.io/v1/api", ""},
		{"", "", ""},
		{"/", "/", ""},
	} {
		rest, under := p.Strip(c.path)
		if rest != c.rest || under != c.under {
			t.Errorf("Strip(%q) = %q, %q; want %q, %q", c.path, rest, under, c.rest, c.under)
		}
	}
	if rest, under := (Paths{}).Strip(prefix + "/api"); rest != prefix+"/api" || under != "" {
		t.Errorf("zero Paths: %q %q", rest, under)
	}
}

// FuzzStrip: Strip never panics, never yields a path outside the prefix it
// names, and a path below Prefix is never read as below Root.
func FuzzStrip(f *testing.F) {
	p := For("f")
	for _, s := range []string{"", "/", p.Root, p.Prefix, p.Root + "/", p.Prefix + "/", p.Prefix + "/api/v1/pods", p.Root + "/api/v1/pods",
		p.Root + "x", p.Prefix + "x", "/apis/f.cache.cachetier.io", "/api/v1/pods", p.Prefix + "/../../x", p.Prefix + "//api"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		rest, under := p.Strip(path)
		switch under {
		case "":
			if rest != path {
				t.Fatalf("%q: outside the prefixes, rest %q", path, rest)
			}
			if strings.HasPrefix(path, p.Root+"/") || path == p.Root {
				t.Fatalf("%q: below Root but not stripped", path)
			}
			return
		case p.Root, p.Prefix:
		default:
			t.Fatalf("%q: under %q", path, under)
		}
		if under+rest != path {
			t.Fatalf("%q: %q + %q", path, under, rest)
		}
		if rest != "" && rest[0] != '/' {
			t.Fatalf("%q: rest %q does not start a path", path, rest)
		}
		if strings.HasPrefix(path, p.Prefix+"/") != (under == p.Prefix) {
			t.Fatalf("%q: under %q", path, under)
		}
	})
}

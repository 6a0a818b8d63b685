// Command coredns is CoreDNS with only the plugins the test node's cluster
// DNS uses (see hack/imagebuild's Corefile). Upstream's binary links every
// in-tree plugin, including cloud backends and `forward`; this one cannot
// send a query to any resolver outside the cluster, which the network rule
// forbids, and it links a fraction of the code.
//
// Kept in its own module, like hack/k8s-build, so CoreDNS's dependency graph
// stays out of cachetier's go.mod.
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	// Each import registers one plugin with Caddy.
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
)

// plugins are the directives this build accepts, one per import above
// (metrics' directive is "prometheus").
var plugins = []string{
	"cache", "errors", "health", "kubernetes", "loadbalance", "log",
	"loop", "prometheus", "ready", "reload", "template",
}

func main() {
	directives, err := keep(dnsserver.Directives, plugins)
	if err == nil {
		err = dnsserver.SetDirectives(directives)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coredns:", err)
		os.Exit(1)
	}
	coremain.Run()
}

// keep returns the directives of all that are in want, in all's order: the
// order in which plugins handle a query is upstream's (plugin.cfg), not the
// order of our list.
func keep(all, want []string) ([]string, error) {
	var out []string
	for _, d := range all {
		if slices.Contains(want, d) {
			out = append(out, d)
		}
	}
	if len(out) != len(want) {
		return nil, fmt.Errorf("CoreDNS knows directives %v; this build wants %v", all, want)
	}
	return out, nil
}

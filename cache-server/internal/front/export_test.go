package front

import "testing"

// NewPodsServer serves n pods in namespaces ns-0.. and on nodes node-0..
// (costPods) from a real store, ingested from a loopback apiserver, with
// the node index and a watch hub. For tests in package front_test — the
// priority-and-fairness estimator's (package apf imports front, so they
// cannot live in package front). stop ends it.
func NewPodsServer(tb testing.TB, n, namespaces, nodes int) (srv *Server, stop func()) {
	tier := newBenchTierOf(tb, costPods(n, namespaces, nodes), benchResource{resource: "pods", kind: "Pod"}, true, true)
	return tier.srv, tier.stop
}

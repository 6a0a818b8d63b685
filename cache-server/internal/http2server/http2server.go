// Package http2server configures the HTTP/2 server of the tier's HTTPS
// APIs (serving.Run), one place for the roles and for the tests that must
// run what they run.
package http2server

import (
	"net/http"

	"golang.org/x/net/http2"
)

// Configure serves HTTP/2 on srv with golang.org/x/net/http2, as
// kube-apiserver does (k8s.io/apiserver's secure serving), with a write
// scheduler whose cost per frame does not grow with the connection's idle
// streams.
//
// Why: the default scheduler (net/http's bundled server and x/net's alike)
// is round-robin over every open stream of a connection, and each frame
// written walks that ring until a stream with data; the walk that ends a
// burst, finding nothing, visits every stream. A connection carrying many
// quiet watches — the aggregator puts every user's watch on its few
// connections to the tier, a client holds up to MaxConcurrentStreams (250)
// on one — pays it for every event: with 2,000 node-scoped watchers
// (hack/bench -mode nodes, ~4 events a second per node) the walk,
// net/http.(*http2writeQueue).empty, was a quarter of the tier's CPU. The
// random scheduler keeps only the streams that have frames queued, so a
// frame costs the same beside 1 idle stream or 250. It ignores priorities,
// as the round-robin one does; control frames still go first, and a
// stream's own frames stay in order.
func Configure(srv *http.Server) error {
	return http2.ConfigureServer(srv, &http2.Server{
		NewWriteScheduler: http2.NewRandomWriteScheduler,
	})
}

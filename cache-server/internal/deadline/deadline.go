// Package deadline bounds how long a request that is not a watch may
// take, as kube-apiserver's --request-timeout (60 s by default) bounds
// its non-long-running requests (WithRequestDeadline and
// WithTimeoutForNonLongRunningRequests in DefaultBuildHandlerChain).
//
// Why: a LIST holds what it serves until the client has read it — the
// snapshot of the objects it walks, a fixed write buffer (every form is
// streamed, see front's writeList), and on a fleet front the copies of
// the items it collects (a page, and the non-JSON forms of a LIST). A
// client that reads a large LIST slowly, or stops reading, would hold
// that memory, and its priority-and-fairness seats, for as long as it
// keeps the connection open. At the deadline the
// request's writes fail (HTTP/2: its stream is reset; HTTP/1: the
// connection is closed), the handler returns and releases both — as the
// apiserver's timeout filter aborts a request still running after 60 s.
//
// The request's context gets the same deadline, so a request waiting in
// a priority level's queue waits at most a quarter of it (15 s: the
// filter's wait limit is derived from the context's deadline, as in
// kube-apiserver).
package deadline

import (
	"context"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/endpoints/request"
)

// RequestTimeout is kube-apiserver's --request-timeout default.
const RequestTimeout = 60 * time.Second

// Filter puts handler behind the deadline: every request but a watch
// (which has its own timeoutSeconds and slow-watcher bounds) must be
// written within timeout. It needs the RequestInfo in the context (inside
// WithRequestInfo). timedOut, when set, is called for a request whose
// handler was still running at its deadline.
func Filter(handler http.Handler, timeout time.Duration, timedOut func(r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := request.RequestInfoFrom(r.Context()); ok && info.Verb == "watch" {
			handler.ServeHTTP(w, r)
			return
		}
		deadline := time.Now().Add(timeout)
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		defer cancel()
		rc := http.NewResponseController(w)
		// A writer without deadlines (none of net/http's) is served
		// with the context's deadline only.
		if err := rc.SetWriteDeadline(deadline); err == nil {
			// HTTP/1 sets it on the connection, which serves the next
			// request too; a deadline already passed broke it anyway.
			defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
		}
		handler.ServeHTTP(w, r.WithContext(ctx))
		// By the clock, not ctx.Err(): the failed write cancels the
		// request's context (the stream or connection is gone), which
		// may come first.
		if timedOut != nil && !time.Now().Before(deadline) {
			timedOut(r)
		}
	})
}

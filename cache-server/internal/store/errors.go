package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ExpiredError reports that the state at RV has left the history window.
//
// It implements apierrors.APIStatus, so apierrors.IsResourceExpired(err) is
// true and the HTTP layer can write it as is. The status is what a client of
// kube-apiserver 1.34+ sees for a LIST at an exact RV that is too old: the
// watch cache's own "too old resource version" error makes the cacher fall
// back to etcd (CacheDelegator.GetList, ListFromCacheSnapshot), and etcd
// answers 410 Expired "The resourceVersion for the provided list is too
// old." (storage/etcd3/errors.go). Our history window plays etcd's role, so
// we answer with etcd's message. A LIST with a continue token should answer
// with continuetoken.Expired instead, which carries a fresh token.
type ExpiredError struct {
	RV uint64
	// Oldest is the oldest resourceVersion still served (0 if unknown).
	Oldest uint64
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("resourceVersion %d is older than the history window (oldest %d)", e.RV, e.Oldest)
}

func (e *ExpiredError) Status() metav1.Status {
	return metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusGone,
		Reason:  metav1.StatusReasonExpired,
		Message: "The resourceVersion for the provided list is too old.",
	}
}

// TooLargeResourceVersionError reports that a read asked for a
// resourceVersion the store has not applied yet (Snapshot/List at a future
// RV, or WaitForRV giving up when its context ends).
//
// Its status is the one kube-apiserver returns when the watch cache does not
// catch up in time (k8s.io/apiserver/pkg/storage/errors.go
// NewTooLargeResourceVersionError): 504 Timeout, message "Timeout: Too large
// resource version: N, current: M", RetryAfterSeconds and the cause
// ResourceVersionTooLarge, which client-go's reflector recognises.
type TooLargeResourceVersionError struct {
	RV, Current uint64
	// RetryAfterSeconds is what the client is told to wait; the apiserver
	// uses 1 (cacher resourceVersionTooHighRetrySeconds).
	RetryAfterSeconds int32
	// Err is the context error when the wait was cut short.
	Err error
}

func (e *TooLargeResourceVersionError) Error() string { return e.Status().Message }

func (e *TooLargeResourceVersionError) Unwrap() error { return e.Err }

func (e *TooLargeResourceVersionError) Status() metav1.Status {
	retry := e.RetryAfterSeconds
	if retry == 0 {
		retry = 1
	}
	return metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusGatewayTimeout,
		Reason:  metav1.StatusReasonTimeout,
		Message: fmt.Sprintf("Timeout: Too large resource version: %d, current: %d", e.RV, e.Current),
		Details: &metav1.StatusDetails{
			RetryAfterSeconds: retry,
			Causes: []metav1.StatusCause{{
				Type:    metav1.CauseTypeResourceVersionTooLarge,
				Message: "Too large resource version",
			}},
		},
	}
}

// ErrStaleEvent is returned by Apply for an event whose RV is not newer than
// what the shard already applied: applying it would move history backwards.
var ErrStaleEvent = errors.New("event resourceVersion is not newer than the applied resourceVersion")

func tooLarge(ctx context.Context, rv, current uint64) error {
	var cause error
	if ctx != nil {
		cause = ctx.Err()
	}
	return &TooLargeResourceVersionError{RV: rv, Current: current, Err: cause}
}

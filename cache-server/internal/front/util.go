package front

import (
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func runtimeRaw(b []byte) runtime.RawExtension { return runtime.RawExtension{Raw: b} }

func schemaGR() schema.GroupResource { return schema.GroupResource{} }

// readOnlyWatchPending answers watch requests until watch streaming is
// served from the cache (the watch issue); it says so plainly instead of
// pretending.
func readOnlyWatchPending(resource string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusMethodNotAllowed,
		Reason:  metav1.StatusReasonMethodNotAllowed,
		Message: "cachetier: watch on " + resource + " is not served by this version of the tier yet; use the kube-apiserver for watches",
		Details: &metav1.StatusDetails{Kind: resource},
	}}
}

package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// InitialEventsEndAnnotation marks the bookmark that ends a watch-list's
// initial events (KEP-3157).
const InitialEventsEndAnnotation = "k8s.io/initial-events-end"

// Resource is one upstream resource the tier ingests.
type Resource struct {
	GVR        schema.GroupVersionResource
	Kind       string
	Namespaced bool
	// LabelSelector filters ingestion upstream (the profile's selector).
	LabelSelector string
}

// Path is the collection path of the resource on the apiserver.
func (r Resource) Path() string {
	if r.GVR.Group == "" {
		return "/api/" + r.GVR.Version + "/" + r.GVR.Resource
	}
	return "/apis/" + r.GVR.Group + "/" + r.GVR.Version + "/" + r.GVR.Resource
}

// String is group/version/resource, used in logs and metric labels.
func (r Resource) String() string {
	if r.GVR.Group == "" {
		return r.GVR.Resource
	}
	return r.GVR.Resource + "." + r.GVR.Group
}

// rawEvent is one frame of a JSON watch stream. The object stays raw: the
// tier stores bytes, it does not decode them into Go types.
type rawEvent struct {
	Type string
	// Object is a view into the stream's buffer, valid until the stream's
	// next event: what is kept of it is copied (Ingester.decode).
	Object json.RawMessage
}

// eventStream reads a JSON watch response frame by frame (frames.go).
type eventStream struct {
	body   io.ReadCloser
	frames *frameReader
}

func (s *eventStream) next() (rawEvent, error) {
	frame, err := s.frames.next()
	if err != nil {
		return rawEvent{}, err
	}
	typ, obj, err := eventParts(frame)
	return rawEvent{Type: typ, Object: obj}, err
}

func (s *eventStream) Close() error { return s.body.Close() }

// get sends GET u?q with the resource's label selector (the profile's
// ingestion filter applies to every upstream read) and returns the 200
// response, or the apiserver's error as a StatusError.
func get(ctx context.Context, c *http.Client, u string, res Resource, q url.Values) (*http.Response, error) {
	if res.LabelSelector != "" {
		q.Set("labelSelector", res.LabelSelector)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if q.Get("watch") == "1" {
		// Watch streams uncompressed. kube-apiserver gzips a watch-list's
		// response when the client accepts it, and Go's transport accepts
		// it unless told otherwise; the ingestion watch-list then lives on
		// with every event compressed on its own (a gzip member per flush:
		// header, Huffman tables, trailer) by the apiserver and inflated
		// here — CPU on both sides per update, to save bytes on the
		// in-cluster link (docs/benchmarks.md, node-scoped watches).
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, statusError(resp)
	}
	return resp, nil
}

// openWatch starts a watch request with the given query (watch=1 is added)
// and returns the event stream, or the apiserver's error as a StatusError.
func openWatch(ctx context.Context, c *http.Client, host string, res Resource, q url.Values) (*eventStream, error) {
	q.Set("watch", "1")
	resp, err := get(ctx, c, host+res.Path(), res, q)
	if err != nil {
		return nil, err
	}
	return newEventStream(resp.Body, streamBuffer), nil
}

// newEventStream reads a watch response body frame by frame, size bytes
// at a time (streamBuffer, or shortStreamBuffer for the RV fetch); the
// progress prober reads its short watches through it too.
func newEventStream(body io.ReadCloser, size int) *eventStream {
	return &eventStream{body: body, frames: newFrameReader(body, size)}
}

// listPage fetches one page of a LIST.
type listPage struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// getList reads one page of the collection at URL u.
func getList(ctx context.Context, c *http.Client, u string, res Resource, q url.Values) (*listPage, error) {
	resp, err := get(ctx, c, u, res, q)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var page listPage
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, fmt.Errorf("decode list of %s: %w", u, err)
	}
	return &page, nil
}

// statusError turns a non-200 response into a *StatusError, keeping the
// apiserver's code and reason so callers can test for 410 Gone and friends.
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		return &apierrors.StatusError{ErrStatus: st}
	}
	return apierrors.NewGenericServerResponse(resp.StatusCode, resp.Request.Method, schema.GroupResource{}, "", strings.TrimSpace(string(body)), 0, false)
}

// eventStatus decodes the Status object of an ERROR watch event.
func eventStatus(raw json.RawMessage) error {
	var st metav1.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("undecodable ERROR event: %s", raw)
	}
	return &apierrors.StatusError{ErrStatus: st}
}

// bookmarkInfo extracts the RV and the initial-events-end flag of a
// BOOKMARK event's object.
func bookmarkInfo(raw json.RawMessage) (rv uint64, initialEnd bool, err error) {
	var m struct {
		Metadata struct {
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return 0, false, fmt.Errorf("decode bookmark: %w", err)
	}
	rv, err = ParseRV(m.Metadata.ResourceVersion)
	return rv, m.Metadata.Annotations[InitialEventsEndAnnotation] == "true", err
}

// isGone reports a 410: the RV left the apiserver's history, relist.
func isGone(err error) bool {
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

var errStreamEnded = errors.New("watch stream ended")

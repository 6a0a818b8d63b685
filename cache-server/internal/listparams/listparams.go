// Package listparams parses and validates the query of a LIST, WATCH or GET
// request the way kube-apiserver does, and classifies it into the rows of the
// KEP-2340 tables (how fresh the answer must be and which state serves it).
//
// Parsing goes through apimachinery's own code (the meta.k8s.io parameter
// codec, SetListOptionsDefaults, ValidateListOptions, fields.Selector
// Transform) in the order of k8s.io/apiserver/pkg/endpoints/handlers/get.go
// listOpts, followed by the checks the storage layer makes
// (k8s.io/apiserver/pkg/storage/interfaces.go ValidateListOptions), so error
// codes and messages match the apiserver's byte for byte.
package listparams

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cachetier/cachetier/cache-server/internal/continuetoken"
	"github.com/cachetier/cachetier/cache-server/internal/keyhash"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Verb is the kind of read.
type Verb string

const (
	List  Verb = "list"
	Watch Verb = "watch"
	Get   Verb = "get"
)

// Options describe the request beyond its query.
type Options struct {
	// Namespace of the request path ("" for all namespaces or a
	// cluster-scoped resource); continue tokens must stay inside it.
	Namespace string
	// Name is set for requests on one object (GET, or a WATCH of
	// /…/pods/<name>); the apiserver turns it into a metadata.name field
	// selector and rejects a conflicting one.
	Name string
	// ConvertFieldLabel is the resource's field label conversion (package
	// fields); nil means the apiserver's default, which knows only
	// metadata.name and metadata.namespace.
	ConvertFieldLabel func(label, value string) (string, string, error)
	// WatchListDisabled mirrors turning the WatchList feature gate off
	// (it is on by default since Kubernetes 1.34). It changes defaulting of
	// watches and whether sendInitialEvents is allowed.
	WatchListDisabled bool
}

// ReadMode is how fresh the served state must be (KEP-2340 tables).
type ReadMode int

const (
	// ReadConsistent: fetch the apiserver's current RV, wait until the
	// cache has applied it, serve the latest state (RV unset; a continue
	// token with the "latest" RV; watch-list from "now").
	ReadConsistent ReadMode = iota + 1
	// ReadAny: serve the latest cached state without waiting (RV "0").
	ReadAny
	// ReadNotOlderThan: wait until the cache has applied RV, serve the
	// latest state.
	ReadNotOlderThan
	// ReadExact: serve the state at exactly RV (a snapshot; 410 if it
	// left the history window). For a watch without initial events: stream
	// the events after RV.
	ReadExact
)

func (m ReadMode) String() string {
	switch m {
	case ReadConsistent:
		return "Consistent"
	case ReadAny:
		return "Any"
	case ReadNotOlderThan:
		return "NotOlderThan"
	case ReadExact:
		return "Exact"
	}
	return fmt.Sprintf("ReadMode(%d)", int(m))
}

// Read is the classification of a request.
type Read struct {
	Mode ReadMode
	// RV for ReadNotOlderThan and ReadExact; 0 otherwise.
	RV uint64
}

// Request is a parsed, validated request.
type Request struct {
	Verb Verb
	// ListOptions as the apiserver sees them after decoding, defaulting and
	// field label conversion (nil for GET).
	ListOptions *metainternalversion.ListOptions
	// ResourceVersion is the raw query value.
	ResourceVersion string

	// LabelSelector and FieldSelector are never nil (Everything when
	// absent). Field labels are already converted for the resource.
	LabelSelector labels.Selector
	FieldSelector fields.Selector

	Read Read
	// Limit is the page size to apply; 0 = no limit. It is 0 for
	// resourceVersion=0 even if the query has a limit: the watch cache
	// ignores limit then (cacher computeListLimit).
	Limit int64
	// ContinueKey is the key to resume after (from the continue token).
	ContinueKey string
	// ContinueRemaining is the number of items after ContinueKey that the
	// previous page counted (continuetoken.Token.Remaining); -1 = unknown.
	// Only meaningful with a ContinueKey (0 otherwise).
	ContinueRemaining int64

	// InitialEvents: a watch starts with the current state as ADDED events.
	InitialEvents bool
	// InitialEventsEndBookmark: after the initial events, send the bookmark
	// annotated k8s.io/initial-events-end (sendInitialEvents=true and
	// allowWatchBookmarks=true, apiserver isListWatchRequest).
	InitialEventsEndBookmark bool
	AllowWatchBookmarks      bool
	TimeoutSeconds           *int64
}

// Parse parses query for verb. Every error is a *StatusError with the code,
// reason and message kube-apiserver returns for the same request.
func Parse(query url.Values, verb Verb, opts Options) (*Request, error) {
	switch verb {
	case Get:
		return parseGet(query, opts)
	case List, Watch:
		return parseListOrWatch(query, verb, opts)
	}
	return nil, fmt.Errorf("listparams: unknown verb %q", verb)
}

func parseGet(query url.Values, opts Options) (*Request, error) {
	var getOpts metav1.GetOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &getOpts); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	r := &Request{
		Verb:            Get,
		ResourceVersion: getOpts.ResourceVersion,
		LabelSelector:   labels.Everything(),
		FieldSelector:   fields.Everything(),
	}
	rv, err := parseRV(getOpts.ResourceVersion)
	if err != nil {
		// The cacher returns the versioner's storage.InvalidError as is and
		// the GET handler reports an unknown error as a 500.
		return nil, unknownError(err)
	}
	r.Read = notOlderThan(getOpts.ResourceVersion, rv)
	return r, nil
}

func parseListOrWatch(query url.Values, verb Verb, opts Options) (*Request, error) {
	watchList := !opts.WatchListDisabled
	lo := &metainternalversion.ListOptions{}
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, lo); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	if verb == Watch {
		// The /watch/ path prefix and ?watch=true are the same request.
		lo.Watch = true
	} else if lo.Watch {
		verb = Watch
	}
	metainternalversion.SetListOptionsDefaults(lo, watchList)
	if errs := metainternalversionvalidation.ValidateListOptions(lo, watchList); len(errs) > 0 {
		return nil, apierrors.NewInvalid(schema.GroupKind{Group: metav1.GroupName, Kind: "ListOptions"}, "", errs)
	}
	if lo.FieldSelector != nil {
		convert := opts.ConvertFieldLabel
		if convert == nil {
			convert = runtime.DefaultMetaV1FieldSelectorConversion
		}
		sel, err := lo.FieldSelector.Transform(convert)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		lo.FieldSelector = sel
	}
	if opts.Name != "" {
		if lo.FieldSelector != nil && !lo.FieldSelector.Empty() {
			selected, ok := lo.FieldSelector.RequiresExactMatch("metadata.name")
			if !ok || selected != opts.Name {
				return nil, apierrors.NewBadRequest("fieldSelector metadata.name doesn't match requested name")
			}
		} else {
			lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.Name)
		}
	}

	r := &Request{
		Verb:                verb,
		ListOptions:         lo,
		ResourceVersion:     lo.ResourceVersion,
		LabelSelector:       lo.LabelSelector,
		FieldSelector:       lo.FieldSelector,
		AllowWatchBookmarks: lo.AllowWatchBookmarks,
		TimeoutSeconds:      lo.TimeoutSeconds,
	}
	if r.LabelSelector == nil {
		r.LabelSelector = labels.Everything()
	}
	if r.FieldSelector == nil {
		r.FieldSelector = fields.Everything()
	}
	if verb == Watch {
		return r, classifyWatch(r, lo)
	}
	return r, classifyList(r, lo, opts)
}

// classifyList applies the storage layer's checks (interfaces.go
// ValidateListOptions, for a collection list) and the KEP-2340 LIST table.
func classifyList(r *Request, lo *metainternalversion.ListOptions, opts Options) error {
	r.Limit = lo.Limit
	if r.Limit < 0 || lo.ResourceVersion == "0" {
		r.Limit = 0
	}
	if lo.Continue != "" {
		tok, err := continuetoken.Decode(lo.Continue, keyhash.NamespacePrefix(opts.Namespace))
		if err != nil {
			return err
		}
		if len(lo.ResourceVersion) > 0 && lo.ResourceVersion != "0" {
			return apierrors.NewBadRequest("specifying resource version is not allowed when using continue")
		}
		r.ContinueKey, r.ContinueRemaining = tok.LastKey, tok.Remaining
		if tok.RV == 0 {
			r.Read = Read{Mode: ReadConsistent}
		} else {
			r.Read = Read{Mode: ReadExact, RV: tok.RV}
		}
		return nil
	}
	if lo.ResourceVersion == "" {
		r.Read = Read{Mode: ReadConsistent}
		return nil
	}
	rv, err := parseRV(lo.ResourceVersion)
	if err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("invalid resource version: %v", err))
	}
	switch lo.ResourceVersionMatch {
	case metav1.ResourceVersionMatchExact:
		r.Read = Read{Mode: ReadExact, RV: rv}
	case metav1.ResourceVersionMatchNotOlderThan:
		r.Read = notOlderThan(lo.ResourceVersion, rv)
	default:
		// Legacy: a limited list at a given RV is an exact read.
		if r.Limit > 0 && rv > 0 {
			r.Read = Read{Mode: ReadExact, RV: rv}
		} else {
			r.Read = notOlderThan(lo.ResourceVersion, rv)
		}
	}
	return nil
}

// classifyWatch follows the KEP-2340 WATCH table. Continue and limit are
// ignored for watches, as by the apiserver.
func classifyWatch(r *Request, lo *metainternalversion.ListOptions) error {
	rv, err := parseRV(lo.ResourceVersion)
	if err != nil {
		// cacher.Watch returns the versioner's error unconverted and the
		// handler answers 500 with it.
		return unknownError(err)
	}
	switch {
	case lo.SendInitialEvents != nil:
		r.InitialEvents = *lo.SendInitialEvents
		r.InitialEventsEndBookmark = *lo.SendInitialEvents && lo.AllowWatchBookmarks
		switch {
		case lo.ResourceVersion == "":
			r.Read = Read{Mode: ReadConsistent}
		case rv == 0:
			r.Read = Read{Mode: ReadAny}
		case r.InitialEvents:
			r.Read = Read{Mode: ReadNotOlderThan, RV: rv}
		default:
			r.Read = Read{Mode: ReadExact, RV: rv}
		}
	case lo.ResourceVersion == "":
		// Legacy (WatchList off): list the current state, then stream.
		r.InitialEvents = true
		r.Read = Read{Mode: ReadConsistent}
	case rv == 0:
		r.InitialEvents = true
		r.Read = Read{Mode: ReadAny}
	default:
		r.Read = Read{Mode: ReadExact, RV: rv}
	}
	return nil
}

// Matcher returns the store.ListRequest.Match for the request's selectors,
// or nil when both are empty. nil matters: like the apiserver's
// SelectionPredicate.Empty(), it is what lets a page report
// remainingItemCount.
func (r *Request) Matcher() func(*store.Object) bool {
	if r.LabelSelector.Empty() && r.FieldSelector.Empty() {
		return nil
	}
	ls, fs := r.LabelSelector, r.FieldSelector
	return func(o *store.Object) bool {
		return ls.Matches(labels.Set(o.Labels)) && fs.Matches(o.FieldSet())
	}
}

// IndexValue is the first of the indexed fields that the field selector
// requires to equal a value ("=" or "=="; "!=" and set-based terms cannot
// use an index), as the apiserver's SelectionPredicate.MatcherIndex picks
// it; ok is false when the selector pins none of them.
func (r *Request) IndexValue(indexed []string) (iv store.IndexValue, ok bool) {
	for _, f := range indexed {
		if v, found := r.FieldSelector.RequiresExactMatch(f); found {
			return store.IndexValue{Field: f, Value: v}, true
		}
	}
	return store.IndexValue{}, false
}

// ListIndex is the index a LIST reads through and the continuation rule
// of its page (store.ListRequest.Index and ContinueByIndex), decided as
// kube-apiserver's watch cache decides whether to answer from its own
// index (watch_cache.go waitUntilFreshAndList): a first page (no continue
// token) of a consistent, resourceVersion=0 or NotOlderThan read whose
// field selector pins one of apiserverIndexes (the resource's
// Fields.APIServerIndexes) is read from that index there, and continues
// only if more objects with that value follow. Exact reads (Exact, a limit
// with a resourceVersion and no match, continue pages) come from a
// snapshot without the index, and a resource the apiserver serves without
// a watch cache (apiserverCaches false) from etcd: a page continues when
// any object follows. Those — and selectors that pin only a field the
// profile indexes (fieldIndexes) — still read through the tier's index,
// with that scan rule.
func (r *Request) ListIndex(fieldIndexes, apiserverIndexes []string, apiserverCaches bool) (iv store.IndexValue, continueByIndex bool) {
	if apiserverCaches && r.ContinueKey == "" && r.Read.Mode != ReadExact {
		if iv, ok := r.IndexValue(apiserverIndexes); ok {
			return iv, true
		}
	}
	iv, _ = r.IndexValue(fieldIndexes)
	return iv, false
}

// SelectorText is the request's selectors in canonical text form, for a
// reader in another process (store.ListRequest.Selector); empty parts for
// absent selectors.
func (r *Request) SelectorText() store.Selector {
	var sel store.Selector
	if !r.LabelSelector.Empty() {
		sel.Label = r.LabelSelector.String()
	}
	if !r.FieldSelector.Empty() {
		sel.Field = r.FieldSelector.String()
	}
	return sel
}

func notOlderThan(raw string, rv uint64) Read {
	switch {
	case raw == "":
		return Read{Mode: ReadConsistent}
	case rv == 0:
		return Read{Mode: ReadAny}
	}
	return Read{Mode: ReadNotOlderThan, RV: rv}
}

// parseRV is the apiserver's APIObjectVersioner.ParseResourceVersion: "" and
// "0" are 0, anything else must be a uint64, and the error is a field
// error list on resourceVersion.
func parseRV(s string) (uint64, error) {
	if s == "" || s == "0" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, field.ErrorList{field.Invalid(field.NewPath("resourceVersion"), s, err.Error())}.ToAggregate()
	}
	return v, nil
}

// unknownError is what the apiserver's ErrorToAPIStatus makes of an error
// that is not an API status: 500 with an empty reason.
func unknownError(err error) *apierrors.StatusError {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusInternalServerError,
		Reason:  metav1.StatusReasonUnknown,
		Message: err.Error(),
	}}
}

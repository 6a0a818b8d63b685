package listparams

import (
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/runtime"
	"net/http"
	"net/url"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apistorage "k8s.io/apiserver/pkg/storage"

	"github.com/cachetier/cachetier/cache-server/internal/continuetoken"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

func q(s string) url.Values {
	v, err := url.ParseQuery(s)
	if err != nil {
		panic(err)
	}
	return v
}

func status(t *testing.T, err error) metav1.Status {
	t.Helper()
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("error %#v is not a *StatusError", err)
	}
	return se.ErrStatus
}

// TestErrors pins the apiserver's code, reason and message for malformed and
// forbidden queries.
func TestErrors(t *testing.T) {
	tok := continuetoken.Encode(5, "ns/a")
	cases := []struct {
		query  string
		verb   Verb
		opts   Options
		code   int32
		reason metav1.StatusReason
		msg    string
	}{
		{"labelSelector=a%3D%3D%3Db", List, Options{}, 400, metav1.StatusReasonBadRequest, "unable to parse requirement: found '=', expected: identifier"},
		{"labelSelector=a+in+(b", Watch, Options{}, 400, metav1.StatusReasonBadRequest, "unable to parse requirement: found '', expected: ',' or ')'"},
		{"fieldSelector=a%3Db%2Cc", List, Options{}, 400, metav1.StatusReasonBadRequest, "invalid selector: 'a=b,c'; can't understand 'c'"},
		{"fieldSelector=foo%3Dbar", List, Options{}, 400, metav1.StatusReasonBadRequest, `"foo" is not a known field selector: only "metadata.name", "metadata.namespace"`},
		{"fieldSelector=foo%3Dbar", List, Options{ConvertFieldLabel: func(l, v string) (string, string, error) {
			return "", "", fmt.Errorf("field label not supported: %s", l)
		}}, 400, metav1.StatusReasonBadRequest, "field label not supported: foo"},
		{"limit=abc", List, Options{}, 400, metav1.StatusReasonBadRequest, `strconv.ParseInt: parsing "abc": invalid syntax`},
		{"timeoutSeconds=x", Watch, Options{}, 400, metav1.StatusReasonBadRequest, `strconv.ParseInt: parsing "x": invalid syntax`},
		{"sendInitialEvents=true", List, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list`},
		{"sendInitialEvents=true", Watch, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan`},
		{"sendInitialEvents=true&resourceVersionMatch=NotOlderThan", Watch, Options{WatchListDisabled: true}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled`},
		{"resourceVersionMatch=Exact", List, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided`},
		{"resourceVersionMatch=Exact&resourceVersion=0", List, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"`},
		{"resourceVersionMatch=Foo&resourceVersion=1", List, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported value: "Foo": supported values: "Exact", "NotOlderThan", ""`},
		{"resourceVersionMatch=NotOlderThan&resourceVersion=1&continue=" + tok, List, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided`},
		{"resourceVersionMatch=NotOlderThan&resourceVersion=5", Watch, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided`},
		// With WatchList on, a watch at RV "" is defaulted to
		// resourceVersionMatch=NotOlderThan, which then conflicts with continue.
		{"continue=" + tok, Watch, Options{}, 422, metav1.StatusReasonInvalid,
			`ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided`},
		{"resourceVersion=abc", List, Options{}, 400, metav1.StatusReasonBadRequest,
			`invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax`},
		{"resourceVersion=-1", Watch, Options{}, 500, metav1.StatusReasonUnknown,
			`resourceVersion: Invalid value: "-1": strconv.ParseUint: parsing "-1": invalid syntax`},
		{"resourceVersion=abc", Get, Options{}, 500, metav1.StatusReasonUnknown,
			`resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax`},
		{"continue=abc", List, Options{}, 400, metav1.StatusReasonBadRequest,
			"invalid continue token: continue key is not valid: invalid character 'i' looking for beginning of value"},
		{"continue=" + tok + "&resourceVersion=5", List, Options{Namespace: "ns"}, 400, metav1.StatusReasonBadRequest,
			"specifying resource version is not allowed when using continue"},
		{"continue=" + tok, List, Options{Namespace: "other"}, 400, metav1.StatusReasonBadRequest,
			"invalid continue token: continue key is not valid: ns/a"},
		{"fieldSelector=metadata.name%3Dother", Watch, Options{Name: "mine"}, 400, metav1.StatusReasonBadRequest,
			"fieldSelector metadata.name doesn't match requested name"},
	}
	for _, c := range cases {
		_, err := Parse(q(c.query), c.verb, c.opts)
		if err == nil {
			t.Errorf("%s %q: no error", c.verb, c.query)
			continue
		}
		st := status(t, err)
		if st.Code != c.code || st.Reason != c.reason || st.Message != c.msg || st.Status != metav1.StatusFailure {
			t.Errorf("%s %q:\n got %d %q %q\nwant %d %q %q", c.verb, c.query, st.Code, st.Reason, st.Message, c.code, c.reason, c.msg)
		}
		if c.code == 422 && (st.Details == nil || st.Details.Kind != "ListOptions" || st.Details.Group != "meta.k8s.io" || len(st.Details.Causes) == 0) {
			t.Errorf("%s %q: invalid details %+v", c.verb, c.query, st.Details)
		}
	}
}

// TestStorageChecksMatchApiserver compares the storage-level LIST checks
// with k8s.io/apiserver/pkg/storage.ValidateListOptions itself.
func TestStorageChecksMatchApiserver(t *testing.T) {
	tok := continuetoken.Encode(5, "ns/a")
	for _, query := range []string{
		"resourceVersion=abc",
		"resourceVersion=1.5&limit=3",
		"resourceVersion=99999999999999999999999",
		"continue=" + tok + "&resourceVersion=7",
		"continue=%25%25",
	} {
		_, err := Parse(q(query), List, Options{})
		lo := &metainternalversion.ListOptions{}
		v := q(query)
		lo.ResourceVersion = v.Get("resourceVersion")
		lo.Continue = v.Get("continue")
		opts := apistorage.ListOptions{ResourceVersion: lo.ResourceVersion, Recursive: true, Predicate: apistorage.SelectionPredicate{Continue: lo.Continue}}
		_, _, want := apistorage.ValidateListOptions("/registry/pods/", apistorage.APIObjectVersioner{}, opts)
		if want == nil || err == nil {
			t.Fatalf("%q: ours %v, apiserver %v", query, err, want)
		}
		if got, exp := status(t, err), status(t, want); got.Code != exp.Code || got.Reason != exp.Reason || got.Message != exp.Message {
			t.Errorf("%q:\n got %+v\nwant %+v", query, got, exp)
		}
	}
}

func TestClassifyList(t *testing.T) {
	tok := continuetoken.Encode(77, "ns/a")
	latestTok := continuetoken.Expired("ns/b").ErrStatus.ListMeta.Continue
	cases := []struct {
		query string
		read  Read
		limit int64
		key   string
	}{
		{"", Read{Mode: ReadConsistent}, 0, ""},
		{"limit=5", Read{Mode: ReadConsistent}, 5, ""},
		{"resourceVersion=0", Read{Mode: ReadAny}, 0, ""},
		{"resourceVersion=0&limit=5", Read{Mode: ReadAny}, 0, ""}, // limit ignored
		{"resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=5", Read{Mode: ReadAny}, 0, ""},
		{"resourceVersion=10", Read{Mode: ReadNotOlderThan, RV: 10}, 0, ""},
		{"resourceVersion=10&limit=5", Read{Mode: ReadExact, RV: 10}, 5, ""}, // legacy exact
		{"resourceVersion=10&resourceVersionMatch=Exact", Read{Mode: ReadExact, RV: 10}, 0, ""},
		{"resourceVersion=10&resourceVersionMatch=Exact&limit=3", Read{Mode: ReadExact, RV: 10}, 3, ""},
		{"resourceVersion=10&resourceVersionMatch=NotOlderThan&limit=5", Read{Mode: ReadNotOlderThan, RV: 10}, 5, ""},
		{"continue=" + tok + "&limit=5", Read{Mode: ReadExact, RV: 77}, 5, "ns/a"},
		{"continue=" + tok + "&resourceVersion=0&limit=5", Read{Mode: ReadExact, RV: 77}, 0, "ns/a"},
		{"continue=" + latestTok + "&limit=5", Read{Mode: ReadConsistent}, 5, "ns/b"},
		{"limit=-3", Read{Mode: ReadConsistent}, 0, ""},
	}
	for _, c := range cases {
		r, err := Parse(q(c.query), List, Options{Namespace: "ns"})
		if err != nil {
			t.Errorf("%q: %v", c.query, err)
			continue
		}
		if r.Verb != List || r.Read != c.read || r.Limit != c.limit || r.ContinueKey != c.key {
			t.Errorf("%q: got %s %+v limit %d key %q, want %+v limit %d key %q", c.query, r.Verb, r.Read, r.Limit, r.ContinueKey, c.read, c.limit, c.key)
		}
		if r.LabelSelector == nil || r.FieldSelector == nil || !r.LabelSelector.Empty() || !r.FieldSelector.Empty() {
			t.Errorf("%q: selectors %v %v", c.query, r.LabelSelector, r.FieldSelector)
		}
	}
	// ?watch=true on a list turns it into a watch.
	r, err := Parse(q("watch=true&resourceVersion=5"), List, Options{})
	if err != nil || r.Verb != Watch {
		t.Fatalf("watch=true: %v %v", r, err)
	}
}

func TestClassifyWatch(t *testing.T) {
	cases := []struct {
		query       string
		disabled    bool
		read        Read
		initial     bool
		endBookmark bool
	}{
		// WatchList on: RV ""/"0" without sendInitialEvents default to a watch-list.
		{"", false, Read{Mode: ReadConsistent}, true, false},
		{"allowWatchBookmarks=true", false, Read{Mode: ReadConsistent}, true, true},
		{"resourceVersion=0&allowWatchBookmarks=true", false, Read{Mode: ReadAny}, true, true},
		{"resourceVersion=5", false, Read{Mode: ReadExact, RV: 5}, false, false},
		{"sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", false, Read{Mode: ReadConsistent}, true, true},
		{"sendInitialEvents=false&resourceVersionMatch=NotOlderThan", false, Read{Mode: ReadConsistent}, false, false},
		{"sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0", false, Read{Mode: ReadAny}, false, false},
		{"sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=9&allowWatchBookmarks=true", false, Read{Mode: ReadNotOlderThan, RV: 9}, true, true},
		{"sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=9", false, Read{Mode: ReadExact, RV: 9}, false, false},
		// WatchList off: legacy behaviour, no initial-events-end bookmark.
		{"allowWatchBookmarks=true", true, Read{Mode: ReadConsistent}, true, false},
		{"resourceVersion=0", true, Read{Mode: ReadAny}, true, false},
		{"resourceVersion=9", true, Read{Mode: ReadExact, RV: 9}, false, false},
		// limit and a valid continue are ignored by watches.
		{"resourceVersion=9&limit=3", false, Read{Mode: ReadExact, RV: 9}, false, false},
	}
	for _, c := range cases {
		r, err := Parse(q(c.query), Watch, Options{WatchListDisabled: c.disabled})
		if err != nil {
			t.Errorf("%q: %v", c.query, err)
			continue
		}
		if r.Verb != Watch || r.Read != c.read || r.InitialEvents != c.initial || r.InitialEventsEndBookmark != c.endBookmark || r.Limit != 0 {
			t.Errorf("%q (watchlist off=%v): got %+v initial=%v end=%v limit=%d", c.query, c.disabled, r.Read, r.InitialEvents, r.InitialEventsEndBookmark, r.Limit)
		}
	}
}

func TestGet(t *testing.T) {
	for query, want := range map[string]Read{
		"":                   {Mode: ReadConsistent},
		"resourceVersion=0":  {Mode: ReadAny},
		"resourceVersion=12": {Mode: ReadNotOlderThan, RV: 12},
		// GET ignores list parameters, as the apiserver does.
		"resourceVersion=12&labelSelector=!!&limit=x": {Mode: ReadNotOlderThan, RV: 12},
	} {
		r, err := Parse(q(query), Get, Options{Name: "a"})
		if err != nil || r.Read != want || r.Verb != Get {
			t.Errorf("GET %q: %+v %v", query, r, err)
		}
	}
	if _, err := Parse(q(""), Verb("delete"), Options{}); err == nil {
		t.Error("unknown verb accepted")
	}
}

func TestSelectors(t *testing.T) {
	conv := func(l, v string) (string, string, error) {
		if l == "spec.host" {
			return "spec.nodeName", v, nil
		}
		return l, v, nil
	}
	r, err := Parse(q("labelSelector=app%3Dweb,tier!%3Dfe&fieldSelector=spec.host%3Dn1"), List, Options{ConvertFieldLabel: conv})
	if err != nil {
		t.Fatal(err)
	}
	if r.LabelSelector.String() != "app=web,tier!=fe" {
		t.Errorf("labels %q", r.LabelSelector)
	}
	if v, ok := r.FieldSelector.RequiresExactMatch("spec.nodeName"); !ok || v != "n1" {
		t.Errorf("field selector not converted: %q", r.FieldSelector)
	}
	// A single-object watch gets a metadata.name selector.
	r, err = Parse(q("resourceVersion=3"), Watch, Options{Name: "pod-1"})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := r.FieldSelector.RequiresExactMatch("metadata.name"); !ok || v != "pod-1" {
		t.Errorf("name selector %q", r.FieldSelector)
	}
	// A matching explicit metadata.name selector is accepted.
	if _, err := Parse(q("fieldSelector=metadata.name%3Dpod-1"), Watch, Options{Name: "pod-1"}); err != nil {
		t.Error(err)
	}
}

// FuzzParse checks that no query makes the parser panic and that every error
// is a StatusError with one of the codes the apiserver uses for bad input:
// 400, 422, and 500 only for an unparsable resourceVersion on WATCH/GET
// (see classifyWatch).
func FuzzParse(f *testing.F) {
	f.Add("labelSelector=a%3Db&fieldSelector=metadata.name%3Dx&limit=5")
	f.Add("watch=1&resourceVersion=0&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
	f.Add("continue=" + continuetoken.Encode(3, "ns/x") + "&limit=1")
	f.Add("continue=abc&resourceVersion=5&resourceVersionMatch=Exact")
	f.Add("resourceVersion=-1&timeoutSeconds=99999999999999999999")
	f.Add("fieldSelector=a%3D%3Db%2C!c&labelSelector=x+in+(a,b),!y")
	// Found by the fuzzer: a LIST turned watch by ?watch with a bad RV.
	f.Add("watch&resourceVersion=A")
	f.Fuzz(func(t *testing.T, raw string) {
		query, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		for _, verb := range []Verb{List, Watch, Get} {
			for _, opts := range []Options{{}, {Namespace: "ns", Name: "n", WatchListDisabled: true}} {
				r, err := Parse(query, verb, opts)
				if err == nil {
					if r.LabelSelector == nil || r.FieldSelector == nil || r.Read.Mode < ReadConsistent || r.Read.Mode > ReadExact {
						t.Fatalf("%s %q: incomplete request %+v", verb, raw, r)
					}
					continue
				}
				var se *apierrors.StatusError
				if !errors.As(err, &se) {
					t.Fatalf("%s %q: error %#v is not a StatusError", verb, raw, err)
				}
				switch se.ErrStatus.Code {
				case http.StatusBadRequest, http.StatusUnprocessableEntity:
				case http.StatusInternalServerError:
					// Only watches and GETs answer a malformed RV with the
					// cacher's unconverted 500; a LIST with watch=true is a
					// watch, as in the apiserver's handler.
					var isWatch bool
					watchParam := query["watch"]
					_ = runtime.Convert_Slice_string_To_bool(&watchParam, &isWatch, nil)
					if (verb == List && !isWatch) || !strings.HasPrefix(se.ErrStatus.Message, "resourceVersion: Invalid value") {
						t.Fatalf("%s %q: unexpected 500 %q", verb, raw, se.ErrStatus.Message)
					}
				default:
					t.Fatalf("%s %q: code %d", verb, raw, se.ErrStatus.Code)
				}
			}
		}
	})
}

func TestMatcher(t *testing.T) {
	r, err := Parse(q(""), List, Options{})
	if err != nil || r.Matcher() != nil {
		t.Fatalf("empty selectors must give a nil matcher: %v", err)
	}
	r, err = Parse(q("labelSelector=app%3Dweb&fieldSelector=metadata.name!%3Dx"), List, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := r.Matcher()
	for _, c := range []struct {
		o    *store.Object
		want bool
	}{
		{&store.Object{Name: "y", Labels: map[string]string{"app": "web"}}, true},
		{&store.Object{Name: "x", Labels: map[string]string{"app": "web"}}, false},
		{&store.Object{Name: "y", Labels: map[string]string{"app": "db"}}, false},
		{&store.Object{}, false},
	} {
		if got := m(c.o); got != c.want {
			t.Errorf("Matcher(%v, name %q) = %v", c.o.Labels, c.o.Name, got)
		}
	}
}

// TestIndexValue: only an equality on an indexed field picks an index, in
// the order of the indexed fields, as MatcherIndex does.
func TestIndexValue(t *testing.T) {
	conv := func(l, v string) (string, string, error) {
		if l == "spec.host" {
			return "spec.nodeName", v, nil
		}
		return l, v, nil
	}
	indexed := []string{"spec.nodeName", "status.phase"}
	cases := []struct {
		query string
		want  store.IndexValue
		ok    bool
	}{
		{"fieldSelector=spec.nodeName%3Dn1", store.IndexValue{Field: "spec.nodeName", Value: "n1"}, true},
		{"fieldSelector=spec.nodeName%3D%3Dn1", store.IndexValue{Field: "spec.nodeName", Value: "n1"}, true},
		{"fieldSelector=spec.host%3Dn2", store.IndexValue{Field: "spec.nodeName", Value: "n2"}, true},
		{"fieldSelector=spec.nodeName%3D", store.IndexValue{Field: "spec.nodeName", Value: ""}, true},
		{"fieldSelector=status.phase%3DRunning,spec.nodeName%3Dn1", store.IndexValue{Field: "spec.nodeName", Value: "n1"}, true},
		{"fieldSelector=status.phase%3DRunning", store.IndexValue{Field: "status.phase", Value: "Running"}, true},
		{"fieldSelector=spec.nodeName!%3Dn1", store.IndexValue{}, false},
		{"fieldSelector=metadata.name%3Dx", store.IndexValue{}, false},
		{"labelSelector=spec.nodeName%3Dn1", store.IndexValue{}, false},
		{"", store.IndexValue{}, false},
	}
	for _, c := range cases {
		r, err := Parse(q(c.query), List, Options{ConvertFieldLabel: conv})
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		got, ok := r.IndexValue(indexed)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: IndexValue = %+v, %v; want %+v, %v", c.query, got, ok, c.want, c.ok)
		}
	}
}

// TestListIndex: the apiserver's index and its continuation rule exactly
// where kube-apiserver's watch cache reads its index
// (waitUntilFreshAndList), the tier's index with the scan rule elsewhere.
func TestListIndex(t *testing.T) {
	indexed := []string{"status.phase", "spec.nodeName"} // a profile's, then the apiserver's
	apiserver := []string{"spec.nodeName"}
	byNode := store.IndexValue{Field: "spec.nodeName", Value: "n1"}
	byPhase := store.IndexValue{Field: "status.phase", Value: "Running"}
	exactToken := url.QueryEscape(continuetoken.Encode(7, "ns/p"))
	latestToken := url.QueryEscape(continuetoken.Expired("ns/p").ErrStatus.ListMeta.Continue)
	cases := []struct {
		query string
		want  store.IndexValue
		rule  bool // the apiserver's index rule
	}{
		{"fieldSelector=spec.nodeName%3Dn1&limit=5", byNode, true},                   // consistent
		{"fieldSelector=spec.nodeName%3D%3Dn1&resourceVersion=0", byNode, true},      // any (limit ignored)
		{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=0&limit=5", byNode, true}, // any
		{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=7&resourceVersionMatch=NotOlderThan&limit=5", byNode, true},
		{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=7", byNode, true}, // not older than, no limit
		{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=7&resourceVersionMatch=Exact&limit=5", byNode, false},
		{"fieldSelector=spec.nodeName%3Dn1&resourceVersion=7&limit=5", byNode, false}, // legacy exact
		{"fieldSelector=spec.nodeName%3Dn1&limit=5&continue=" + exactToken, byNode, false},
		{"fieldSelector=spec.nodeName%3Dn1&limit=5&continue=" + latestToken, byNode, false},                   // consistent, but a continue
		{"fieldSelector=spec.nodeName%3D&limit=5", store.IndexValue{Field: "spec.nodeName"}, true},            // unscheduled pods
		{"fieldSelector=status.phase%3DRunning,spec.nodeName%3Dn1&limit=5", byNode, true},                     // the apiserver's index first
		{"fieldSelector=status.phase%3DRunning,spec.nodeName%3Dn1&resourceVersion=7&limit=5", byPhase, false}, // then the profile's order
		{"fieldSelector=status.phase%3DRunning&limit=5", byPhase, false},                                      // only the profile indexes it
		{"fieldSelector=spec.nodeName!%3Dn1&limit=5", store.IndexValue{}, false},
		{"fieldSelector=spec.nodeName!%3Dn1,status.phase%3DRunning&limit=5", byPhase, false},
		{"labelSelector=app%3Da&limit=5", store.IndexValue{}, false},
		{"limit=5", store.IndexValue{}, false},
	}
	for _, c := range cases {
		r, err := Parse(q(c.query), List, Options{Namespace: "ns", ConvertFieldLabel: func(l, v string) (string, string, error) { return l, v, nil }})
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		if iv, rule := r.ListIndex(indexed, apiserver, true); iv != c.want || rule != c.rule {
			t.Errorf("%s: %+v rule %v, want %+v rule %v", c.query, iv, rule, c.want, c.rule)
		}
		// The apiserver without a watch cache for the resource reads
		// etcd: the scan rule, whatever the read.
		want := c.want
		if c.rule && want.Field == "spec.nodeName" && strings.Contains(c.query, "status.phase%3DRunning") {
			want = byPhase
		}
		if iv, rule := r.ListIndex(indexed, apiserver, false); iv != want || rule {
			t.Errorf("%s uncached: %+v rule %v, want %+v rule false", c.query, iv, rule, want)
		}
	}
}

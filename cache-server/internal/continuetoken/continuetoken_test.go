package continuetoken

import (
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apistorage "k8s.io/apiserver/pkg/storage"
)

func raw(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		rv     uint64
		key    string
		prefix string
	}{
		{1, "ns/name", ""},
		{12345, "ns/name", "ns/"},
		{math.MaxInt64, "node-1", ""},
		{7, "a-b/x.y", "a-b/"},
	}
	for _, c := range cases {
		tok := Encode(c.rv, c.key)
		tk, err := Decode(tok, c.prefix)
		rv, key := tk.RV, tk.LastKey
		if err != nil || rv != c.rv || key != c.key {
			t.Errorf("Decode(Encode(%d,%q),%q) = %d,%q,%v", c.rv, c.key, c.prefix, rv, key, err)
		}
	}
}

// TestEnvelopeIsTheApiserversOwn decodes our tokens with kube-apiserver's own
// DecodeContinue: same base64 flavour, JSON fields and version string.
func TestEnvelopeIsTheApiserversOwn(t *testing.T) {
	tok := Encode(42, "ns/pod-1")
	key, rv, err := apistorage.DecodeContinue(tok, "/registry/pods/")
	if err != nil || rv != 42 || key != "/registry/pods/ns/pod-1" {
		t.Fatalf("apiserver decode: %q %d %v", key, rv, err)
	}
	// The expired error's token is the apiserver's rv=-1 "latest" token.
	st := Expired("ns/pod-1").ErrStatus
	key, rv, err = apistorage.DecodeContinue(st.ListMeta.Continue, "/registry/pods/")
	if err != nil || rv != -1 || key != "/registry/pods/ns/pod-1" {
		t.Fatalf("apiserver decode of expired token: %q %d %v", key, rv, err)
	}
}

// TestErrorsMatchApiserver feeds malformed tokens to both decoders and
// compares our StatusError message with what storage.ValidateListOptions
// builds from the apiserver's DecodeContinue error.
func TestErrorsMatchApiserver(t *testing.T) {
	bad := []string{
		"%%%",                          // not base64
		"eyJ2IjoibWV0YS5rOHMuaW8vdjEi", // truncated JSON
		raw(`not json`),
		raw(`{"v":"meta.k8s.io/v2","rv":1,"start":"a"}`),
		raw(`{"v":"","rv":1,"start":"a"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":0,"start":"a"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":""}`),
		raw(`{"v":"meta.k8s.io/v1","rv":"5","start":"a"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":1e30,"start":"a"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"../a"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"a/../b"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"a//b"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"a/"}`),
		raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"."}`),
		"",
	}
	for _, tok := range bad {
		_, _, apiErr := apistorage.DecodeContinue(tok, "/registry/pods/")
		if apiErr == nil {
			t.Fatalf("apiserver accepted %q", tok)
		}
		want := apierrors.NewBadRequest("invalid continue token: " + apiErr.Error())
		_, err := Decode(tok, "")
		var se *apierrors.StatusError
		if !errors.As(err, &se) {
			t.Fatalf("Decode(%q) err = %#v, want StatusError", tok, err)
		}
		if se.ErrStatus.Code != http.StatusBadRequest || se.ErrStatus.Reason != metav1.StatusReasonBadRequest {
			t.Errorf("Decode(%q) status %d %s", tok, se.ErrStatus.Code, se.ErrStatus.Reason)
		}
		if se.ErrStatus.Message != want.ErrStatus.Message {
			t.Errorf("Decode(%q)\n got: %s\nwant: %s", tok, se.ErrStatus.Message, want.ErrStatus.Message)
		}
	}
}

// TestRangeChecks are our additions: a token must stay inside the namespace
// (or key shape) it is used with.
func TestRangeChecks(t *testing.T) {
	cases := []struct {
		key, prefix string
		ok          bool
	}{
		{"ns/a", "ns/", true},
		{"other/a", "ns/", false}, // issued for another namespace
		{"ns-2/a", "ns/", false},  // prefix-sharing namespace
		{"ns/", "ns/", false},     // no name
		{"ns/a/b", "ns/", false},  // deeper than a key
		{"/ns/a", "", false},      // absolute
		{"a/b/c", "", false},      // deeper than ns/name
		{"name", "", true},        // cluster-scoped
		{"ns/a", "", true},        // all namespaces
		{"ns/a\x00", "", true},    // any byte is just a position
		{"ns/a", "n", false},      // prefix not at a boundary is still checked
	}
	for _, c := range cases {
		tok := Encode(9, c.key)
		tk, err := Decode(tok, c.prefix)
		key := tk.LastKey
		if c.ok != (err == nil) {
			t.Errorf("Decode(key %q, prefix %q) err = %v, want ok=%v", c.key, c.prefix, err, c.ok)
			continue
		}
		if err != nil {
			if !apierrors.IsBadRequest(err) || err.Error() != "invalid continue token: continue key is not valid: "+c.key {
				t.Errorf("err = %q", err)
			}
		} else if key != c.key {
			t.Errorf("key = %q", key)
		}
	}
}

func TestNegativeRVMeansLatest(t *testing.T) {
	for _, rv := range []string{"-1", "-7"} {
		tk, err := Decode(raw(`{"v":"meta.k8s.io/v1","rv":`+rv+`,"start":"ns/a"}`), "ns/")
		if err != nil || tk.RV != 0 || tk.LastKey != "ns/a" || tk.Remaining != -1 {
			t.Errorf("rv %s: %+v %v", rv, tk, err)
		}
	}
}

// A counted token gives its count back only in the scope it was issued
// for; a plain token, a negative count or a latest-RV token give none.
func TestRemainingCount(t *testing.T) {
	tok := EncodeCounted(9, "ns/a", "ns/", 41)
	if tk, err := Decode(tok, "ns/"); err != nil || tk.RV != 9 || tk.LastKey != "ns/a" || tk.Remaining != 41 {
		t.Fatalf("same scope: %+v %v", tk, err)
	}
	if tk, err := Decode(tok, ""); err != nil || tk.Remaining != -1 {
		t.Errorf("cluster-wide use of a namespace token kept its count: %+v %v", tk, err)
	}
	for _, body := range []string{
		`{"v":"meta.k8s.io/v1","rv":9,"start":"ns/a"}`,
		`{"v":"meta.k8s.io/v1","rv":9,"start":"ns/a","rem":-3,"scope":"ns/"}`,
		`{"v":"meta.k8s.io/v1","rv":9,"start":"ns/a","rem":3}`,
		`{"v":"meta.k8s.io/v1","rv":-1,"start":"ns/a","rem":3,"scope":"ns/"}`,
	} {
		if tk, err := Decode(raw(body), "ns/"); err != nil || tk.Remaining != -1 {
			t.Errorf("%s: %+v %v", body, tk, err)
		}
	}
}

func TestExpired(t *testing.T) {
	err := Expired("ns/b")
	st := err.ErrStatus
	if st.Code != http.StatusGone || st.Reason != metav1.StatusReasonExpired || st.Status != metav1.StatusFailure {
		t.Fatalf("status %+v", st)
	}
	if !strings.HasPrefix(st.Message, "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results.") ||
		!strings.HasSuffix(st.Message, "objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.") {
		t.Fatalf("message %q", st.Message)
	}
	tk, derr := Decode(st.ListMeta.Continue, "ns/")
	rv, key := tk.RV, tk.LastKey
	if derr != nil || rv != 0 || key != "ns/b" {
		t.Fatalf("fresh token decodes to %d %q %v", rv, key, derr)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(1, "ns/a"), uint64(1), "ns/a", "")
	f.Add(Encode(99, "node"), uint64(99), "node", "ns/")
	f.Add(Expired("ns/x").ErrStatus.ListMeta.Continue, uint64(math.MaxInt64), "x/y", "x/")
	f.Add(raw(`{"v":"meta.k8s.io/v1","rv":5,"start":"../a"}`), uint64(0), "", "")
	f.Add("%%%", uint64(1<<63), "a//b", "a/")
	f.Fuzz(func(t *testing.T, token string, rv uint64, key, prefix string) {
		got, err := Decode(token, prefix)
		gotRV, gotKey := got.RV, got.LastKey
		if err != nil {
			var se *apierrors.StatusError
			if !errors.As(err, &se) || se.ErrStatus.Code != http.StatusBadRequest ||
				!strings.HasPrefix(se.ErrStatus.Message, "invalid continue token: continue key is not valid") {
				t.Fatalf("Decode(%q) error %#v", token, err)
			}
		} else {
			if !strings.HasPrefix(gotKey, prefix) || gotKey == prefix {
				t.Fatalf("Decode(%q,%q) key %q escapes the prefix", token, prefix, gotKey)
			}
			if strings.Contains("/"+gotKey+"/", "/../") || strings.Contains("/"+gotKey+"/", "/./") {
				t.Fatalf("Decode(%q) key %q has dot segments", token, gotKey)
			}
			// Whatever was accepted re-encodes to something equivalent.
			if gotRV > 0 {
				t2, err := Decode(Encode(gotRV, gotKey), prefix)
				rv2, key2 := t2.RV, t2.LastKey
				if err != nil || rv2 != gotRV || key2 != gotKey {
					t.Fatalf("re-encode of %d %q: %d %q %v", gotRV, gotKey, rv2, key2, err)
				}
			}
		}
		// Round trip of generated valid inputs (JSON cannot carry invalid
		// UTF-8, so such keys are out of scope, as for the apiserver).
		if rv == 0 || rv > math.MaxInt64 || !utf8.ValidString(key) || !validKey(key, prefix) {
			return
		}
		t2, err := Decode(Encode(rv, key), prefix)
		rv2, key2 := t2.RV, t2.LastKey
		if err != nil || rv2 != rv || key2 != key {
			t.Fatalf("round trip %d %q %q: %d %q %v", rv, key, prefix, rv2, key2, err)
		}
	})
}

package jsonproto

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzUnquote: for any string body, unquote agrees with encoding/json on
// whether it is a valid JSON string and, if so, on its value; plainString
// never calls a string plain that encoding/json would change.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`abc`, `a\"b\\c\/d\b\f\n\r\t`, `\u00e9\ud83d\ude00`, `\ud800`, `\ud800\u0041`, `\udc00\ud800`, "a\xffb", "\x01", `\x`, `\u12`, `\u12G4`, "é€😀", `\ud83d\ude0`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if end, _, err := scanString([]byte(body+`"`), 0); err != nil || end != len(body) {
			return // an unescaped quote inside: not one string's body
		}
		var want string
		werr := json.Unmarshal([]byte(`"`+body+`"`), &want)
		got, ok := unquote(nil, []byte(body))
		if ok != (werr == nil) {
			t.Fatalf("unquote(%q) ok=%v, encoding/json err=%v", body, ok, werr)
		}
		if ok && string(got) != want {
			t.Fatalf("unquote(%q) = %q, encoding/json %q", body, got, want)
		}
		if plainString([]byte(body)) && bytes.IndexByte([]byte(body), '\\') < 0 && (werr != nil || want != body) {
			t.Fatalf("plainString(%q) but encoding/json gives %q, %v", body, want, werr)
		}
	})
}

package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
)

// member is a key and a value as encoding/json reads them.
type member struct {
	key   string
	value string
}

// jsonMembers is what encoding/json reads of the object b, in order.
func jsonMembers(b []byte) ([]member, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, member{tok.(string), string(v)})
	}
	return out, true
}

func checkMembers(t *testing.T, b []byte) {
	want, ok := jsonMembers(b)
	if !ok || !json.Valid(b) {
		// Invalid JSON: any answer but a crash.
		_ = Members(b, func(key, value []byte) error { _, _, _ = String(value); return nil })
		return
	}
	var got []member
	if err := Members(b, func(key, value []byte) error {
		got = append(got, member{string(key), string(value)})
		var ws string
		s, isString, err := String(value)
		if value[0] == '"' && json.Unmarshal(value, &ws) == nil {
			if !isString || err != nil || s != ws {
				t.Fatalf("%q: String(%q) = %q, %v, %v; encoding/json %q", b, value, s, isString, err, ws)
			}
		} else if isString {
			t.Fatalf("%q: String(%q) = %q, a string; encoding/json: not one", b, value, s)
		}
		return nil
	}); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%q: members %q, encoding/json %q", b, got, want)
	}
	for i := range got {
		// encoding/json's RawMessage is the value as written.
		if got[i] != want[i] {
			t.Fatalf("%q: member %d is %q, encoding/json %q", b, i, got[i], want[i])
		}
	}
}

// Members and String read valid objects as encoding/json does: keys
// unquoted, values as written, strings unquoted (escapes, invalid UTF-8).
func TestMembers(t *testing.T) {
	for _, s := range []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":"b","c":{"d":[1,2,{"e":"}"}]},"f":null,"g":true,"h":false,"i":-1.5e3}`,
		`{"\u0073pec":"x","a\"b":"c\\d","e":"\u00e9\n"}`, "{\"k\":\"\xff\xfe\"}", "{\"\xff\":\"x\"}", `{"a":"x","a":"y"}`,
		`{"k":"\ud800"}`, `{"a" : [ "]" , "\\" ] , "b" : { } }`,
	} {
		checkMembers(t, []byte(s))
	}
	for _, bad := range []string{``, `[]`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1} x`, `{"a":"`} {
		if err := Members([]byte(bad), func(key, value []byte) error { return nil }); err == nil {
			t.Errorf("Members(%q): no error", bad)
		}
	}
	if _, ok, err := String([]byte(`"`)); ok || err == nil {
		t.Errorf(`String("\""): ok %v, err %v`, ok, err)
	}
}

func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"\u0073":"\u00e9","b":[{"c":"d"}]}`, "{\"k\":\"\xff\"}", "{\"\xff\":1}", `{"a":{"b":"c\"}"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkMembers(t, b) })
}

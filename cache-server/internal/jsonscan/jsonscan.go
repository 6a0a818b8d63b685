// Package jsonscan walks JSON without decoding it: an object's members
// as byte ranges, a value's extent, a string's contents. It tracks strings
// and nesting only and does not validate what it skips (a caller that
// needs valid JSON checks it, e.g. with json.Valid, or decodes what it
// keeps); keys and strings are unquoted as encoding/json unquotes them.
// The tier reads a few fields of objects it stores as bytes: the watch
// frames' type and object, an object's key, the values of its field set.
package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// Members calls fn with each member of the JSON object b (the key
// unquoted as encoding/json unquotes it, and the value's bytes as
// written).
func Members(b []byte, fn func(key, value []byte) error) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return errors.New("not a JSON object")
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return trailing(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return errors.New("object key is not a string")
		}
		end, escaped, err := scanString(b, i)
		if err != nil {
			return err
		}
		key := b[i+1 : end-1]
		if escaped || !plain(key) {
			var k string
			if err := json.Unmarshal(b[i:end], &k); err != nil {
				return err
			}
			key = []byte(k)
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return errors.New("missing ':' after an object key")
		}
		i = skipSpace(b, i+1)
		vend, err := scanValue(b, i)
		if err != nil {
			return err
		}
		if err := fn(key, b[i:vend]); err != nil {
			return err
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			return io.ErrUnexpectedEOF
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return trailing(b, i+1)
		default:
			return fmt.Errorf("unexpected %q after an object member", b[i])
		}
	}
}

func trailing(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errors.New("data after the object")
	}
	return nil
}

// skipSpace returns the first position at or after i that is not JSON
// whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// scanString returns the end (after the closing quote) of the string at
// b[i], and whether it has escapes.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	j := i + 1
	for {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return 0, false, io.ErrUnexpectedEOF
		}
		q += j
		// The escapes before the quote; each backslash is looked at once.
		for {
			e := bytes.IndexByte(b[j:q], '\\')
			if e < 0 {
				return q + 1, escaped, nil
			}
			escaped = true
			if j += e + 2; j > q {
				break // the quote was escaped: find the next one
			}
		}
	}
}

// scanValue returns the end of the JSON value at b[i]. Composite values
// are scanned for nesting and strings only.
func scanValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, io.ErrUnexpectedEOF
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == '{' || c == '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _, err := scanString(b, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, io.ErrUnexpectedEOF
	case c == 't' || c == 'f' || c == 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(b[i:], []byte(lit)) {
				return i + len(lit), nil
			}
		}
		return 0, fmt.Errorf("invalid literal at %.16q", b[i:])
	case c == '-' || (c >= '0' && c <= '9'):
		j := i + 1
		for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == '.' || b[j] == 'e' || b[j] == 'E' || b[j] == '+' || b[j] == '-') {
			j++
		}
		return j, nil
	}
	return 0, fmt.Errorf("invalid value at %.16q", b[i:])
}

// String unquotes a JSON string value as encoding/json does (escapes,
// invalid UTF-8 replaced by U+FFFD); ok is false for another kind of
// value.
func String(v []byte) (s string, ok bool, err error) {
	if len(v) == 0 || v[0] != '"' {
		return "", false, nil
	}
	if len(v) >= 2 && v[len(v)-1] == '"' && plain(v[1:len(v)-1]) {
		return string(v[1 : len(v)-1]), true, nil
	}
	err = json.Unmarshal(v, &s)
	return s, err == nil, err
}

// plain reports whether a string's contents are what they mean: no
// escapes, no control characters (which encoding/json rejects), valid
// UTF-8 (which it would repair).
func plain(in []byte) bool {
	ascii := true
	for _, c := range in {
		switch {
		case c < 0x20 || c == '\\' || c == '"':
			return false
		case c >= 0x80:
			ascii = false
		}
	}
	return ascii || utf8.Valid(in)
}

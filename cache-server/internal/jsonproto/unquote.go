package jsonproto

import (
	"encoding/binary"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// plainString: no control characters and valid UTF-8, so the bytes between
// the quotes are the string. Eight bytes at a time while they are ASCII.
func plainString(b []byte) bool {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		// A byte >= 0x80, or a byte < 0x20 (borrow into its high bit).
		if x&0x8080808080808080 != 0 || (x-0x2020202020202020)&^x&0x8080808080808080 != 0 {
			break
		}
	}
	for j, x := range b[i:] {
		if x < 0x20 {
			return false
		}
		if x >= utf8.RuneSelf {
			rest := b[i+j:]
			return utf8.Valid(rest) && !hasControl(rest)
		}
	}
	return true
}

func hasControl(b []byte) bool {
	for _, x := range b {
		if x < 0x20 {
			return true
		}
	}
	return false
}

// unquote appends the value of a JSON string (s is what lies between the
// quotes) to dst as encoding/json decodes it: escapes resolved, a lone or
// broken surrogate and each invalid UTF-8 byte become U+FFFD. Control
// characters and escapes JSON does not have make it fail, as they make
// encoding/json's scanner fail.
func unquote(dst, s []byte) ([]byte, bool) {
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) {
				return dst, false
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				dst = append(dst, e)
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(s[i+2:])
				if r < 0 {
					return dst, false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					if i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
						r2 := hex4(s[i+2:])
						if r2 < 0 {
							return dst, false // the scanner refuses the broken escape that follows
						}
						if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
							dst = utf8.AppendRune(dst, d)
							i += 6
							continue
						}
					}
					r = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, r)
				continue
			default:
				return dst, false
			}
			i += 2
		case c < 0x20:
			return dst, false
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst, true
}

// hex4 is the value of the four hex digits b starts with, or -1.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

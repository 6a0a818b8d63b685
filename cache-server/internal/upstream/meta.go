package upstream

import (
	"bytes"
	"encoding/json"

	"github.com/cachetier/cachetier/cache-server/internal/jsonscan"
)

// keyMeta is what the store keeps of an object's metadata besides its
// bytes.
type keyMeta struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
	} `json:"metadata"`
}

// decodeKeyMeta is json.Unmarshal(raw, &keyMeta{}), the same answer
// without encoding/json's reflection for the common case. Unmarshal
// scans the whole object twice (checkValid, then decoding while skipping
// every other member) and copies each label through reflection; here
// json.Valid checks it once and the scanner of package jsonscan reads
// the few members. Whatever encoding/json would treat in a way this does
// not mirror — a non-ASCII key (its case folding), a value of another
// type (its error) — goes to json.Unmarshal.
func decodeKeyMeta(raw []byte) (keyMeta, error) {
	var m keyMeta
	if !json.Valid(raw) {
		return m, json.Unmarshal(raw, &m) // its syntax error
	}
	if fastKeyMeta(raw, &m) {
		return m, nil
	}
	m = keyMeta{}
	return m, json.Unmarshal(raw, &m)
}

// fastKeyMeta fills m from raw, which is valid JSON, as json.Unmarshal
// would: keys matched without regard to ASCII case, each occurrence of a
// key applied in order (a string overwritten; a second metadata or labels
// object merged into the first; null leaving a string as it is and
// making labels nil). ok is false when it cannot tell.
func fastKeyMeta(raw []byte, m *keyMeta) (ok bool) {
	ok = true
	err := jsonscan.Members(raw, func(key, value []byte) error {
		if !ascii(key) {
			ok = false
		}
		if !ok || !bytes.EqualFold(key, []byte("metadata")) {
			return nil
		}
		switch value[0] {
		case 'n':
			return nil // null: nothing changes
		case '{':
		default:
			ok = false
			return nil
		}
		return jsonscan.Members(value, func(key, value []byte) error {
			if !ascii(key) {
				ok = false
			}
			var dst *string
			switch {
			case !ok:
				return nil
			case bytes.EqualFold(key, []byte("name")):
				dst = &m.Metadata.Name
			case bytes.EqualFold(key, []byte("namespace")):
				dst = &m.Metadata.Namespace
			case bytes.EqualFold(key, []byte("resourceVersion")):
				dst = &m.Metadata.ResourceVersion
			case bytes.EqualFold(key, []byte("labels")):
				ok = fastLabels(value, &m.Metadata.Labels)
				return nil
			default:
				return nil
			}
			if value[0] == 'n' {
				return nil
			}
			s, isString, err := jsonscan.String(value)
			if !isString || err != nil {
				ok = false
				return nil
			}
			*dst = s
			return nil
		})
	})
	return ok && err == nil
}

// fastLabels decodes a labels value into *labels as json.Unmarshal does
// into a map[string]string: null makes it nil, an object's members are
// added to it (made when nil), a null member value is "".
func fastLabels(value []byte, labels *map[string]string) bool {
	switch value[0] {
	case 'n':
		*labels = nil
		return true
	case '{':
	default:
		return false
	}
	if *labels == nil {
		*labels = map[string]string{}
	}
	ok := true
	err := jsonscan.Members(value, func(key, value []byte) error {
		if value[0] == 'n' {
			(*labels)[string(key)] = ""
			return nil
		}
		s, isString, err := jsonscan.String(value)
		if !isString || err != nil {
			ok = false
			return nil
		}
		(*labels)[string(key)] = s
		return nil
	})
	return ok && err == nil
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

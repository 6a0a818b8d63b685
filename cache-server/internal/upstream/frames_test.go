package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// jsonFrames is what json.Decoder, which the frame reader replaced, reads
// from data: its top-level values and how it ended.
func jsonFrames(data []byte) ([]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var out []json.RawMessage
	for {
		var m json.RawMessage
		if err := dec.Decode(&m); err != nil {
			return out, err
		}
		out = append(out, m)
	}
}

// readFrames reads with the RV fetch's small buffer, which frames cross
// more often; TestFrameReaderMatchesDecoder also reads with the large one.
func readFrames(r io.Reader) ([][]byte, error) {
	return readFramesSized(r, shortStreamBuffer)
}

func readFramesSized(r io.Reader, size int) ([][]byte, error) {
	f := newFrameReader(r, size)
	var out [][]byte
	for {
		b, err := f.next()
		if err != nil {
			return out, err
		}
		out = append(out, bytes.Clone(b))
	}
}

// A stream of valid JSON objects splits exactly where json.Decoder splits
// it, however it arrives (one byte at a time, in halves), with escapes,
// braces inside strings and frames larger than the read buffer.
func TestFrameReaderMatchesDecoder(t *testing.T) {
	big := strings.Repeat(`a\"b\\c{}[]`, 20000) // ~220 KB of escapes and brackets in a string
	events := []string{
		`{"type":"ADDED","object":{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"1"},"data":{"k":"v"}}}`,
		"\n\t{\"type\" : \"MODIFIED\" , \"object\" : {\"data\":{\"s\":\"}{][\\\"\\\\\"}}}\r\n",
		`{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}`,
		`{"type":"ADDED","object":{"data":{"big":"` + big + `"},"n":[1,-2.5e3,true,false,null,{}]}}`,
		`{}`,
		`{"a":"\\"}`,
		`{"a":"\u00e9\\\\"}` + "\n\n   ",
	}
	data := []byte(strings.Join(events, ""))
	want, wantErr := jsonFrames(data)
	if wantErr != io.EOF || len(want) != len(events) {
		t.Fatalf("json.Decoder: %d frames, %v", len(want), wantErr)
	}
	for name, r := range map[string]func() io.Reader{
		"whole":  func() io.Reader { return bytes.NewReader(data) },
		"bytes":  func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
		"halves": func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
	} {
		for _, size := range []int{streamBuffer, shortStreamBuffer} {
			checkFrames(t, fmt.Sprintf("%s, %d B buffer", name, size), r(), size, want)
		}
	}
}

func checkFrames(t *testing.T, name string, r io.Reader, size int, want []json.RawMessage) {
	t.Helper()
	got, err := readFramesSized(r, size)
	if err != io.EOF {
		t.Fatalf("%s: %v", name, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d frames, want %d", name, len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%s: frame %d:\n got  %.200q\n want %.200q", name, i, got[i], want[i])
		}
	}
}

// Cut anywhere, a stream gives its whole frames, then io.EOF at a frame
// boundary (or in whitespace after one) and io.ErrUnexpectedEOF inside a
// frame — what the ingester resumes after.
func TestFrameReaderTruncated(t *testing.T) {
	data := []byte(`{"type":"ADDED","object":{"s":"x\"}"}}` + "\n" + `{"type":"DELETED","object":{}}` + "\n")
	ends := map[int]bool{0: true}
	frames := 0
	for i := range data {
		if got, _ := readFrames(bytes.NewReader(data[:i])); len(got) > frames {
			frames = len(got)
			ends[i] = true
		}
	}
	for cut := 0; cut <= len(data); cut++ {
		_, err := readFrames(iotest.OneByteReader(bytes.NewReader(data[:cut])))
		atEnd := ends[cut] || cut == len(data) || (cut > 0 && data[cut-1] == '\n')
		if want := map[bool]error{true: io.EOF, false: io.ErrUnexpectedEOF}[atEnd]; err != want {
			t.Fatalf("cut at %d (%q): %v, want %v", cut, data[:cut], err, want)
		}
	}
}

func TestFrameReaderRefusesNonObjects(t *testing.T) {
	for _, in := range []string{`[1]`, `"s"`, `1`, `{"a":1} x`} {
		_, err := readFrames(strings.NewReader(in))
		if !errors.Is(err, errNotAnObject) {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestEventParts(t *testing.T) {
	for _, c := range []struct {
		frame, typ, object string
		err                bool
	}{
		{`{"type":"ADDED","object":{"a":1}}`, "ADDED", `{"a":1}`, false},
		{` { "object" : {"a":"}"} , "type" : "DELETED" } `, "DELETED", `{"a":"}"}`, false},
		{`{"type":"MOD\u0049FIED","object":{}}`, "MODIFIED", `{}`, false},
		{`{"t\u0079pe":"X","object":null,"other":[1,{"type":"no"}]}`, "X", `null`, false},
		{`{"type":"A","type":"B","object":{}}`, "B", `{}`, false},
		{`{"TYPE":"A","Object":{"b":2}}`, "A", `{"b":2}`, false},
		{`{"type":1,"object":{}}`, "", "", true},
		{`{"type":"A","object":{}`, "", "", true},
		{`{"type":"A" "object":{}}`, "", "", true},
		{`{"type":"A","object":tru}`, "", "", true},
		{`{"type":"A","object":{}} {}`, "", "", true},
	} {
		typ, obj, err := eventParts([]byte(c.frame))
		if (err != nil) != c.err || (err == nil && (typ != c.typ || string(obj) != c.object)) {
			t.Errorf("%s: %q %q %v", c.frame, typ, obj, err)
		}
	}
}

// objectKey reads what json.Unmarshal reads, or says it cannot.
func TestObjectKey(t *testing.T) {
	for _, c := range []struct {
		raw string
		ok  bool
	}{
		{`{"kind":"Pod","metadata":{"name":"p","namespace":"ns","resourceVersion":"12"},"spec":{"x":"}"}}`, true},
		{`{"metadata":{"name":"n","resourceVersion":"3"}}`, true}, // cluster-scoped
		{`{"metadata":{"resourceVersion":"3","name":"a","name":"b","labels":{"name":"c"}}}`, true},
		{`{"metadata":{"name":"a"},"metadata":{"name":"b","namespace":"x","resourceVersion":"1"}}`, true},
		{`{"Metadata":{"NAME":"x","Namespace":"y","resourceversion":"4"}}`, true},
		{`{"metadata":{"name":"a\u002db","resourceVersion":"1"}}`, false},
		{`{"metadata":{"name":null,"resourceVersion":"1"}}`, false},
		{`{"metadata":[]}`, false},
		{`{"kind":"X"}`, false},
		{`{"metadata":{"name":"a"`, false},
	} {
		ns, name, rv, ok := objectKey([]byte(c.raw))
		if ok != c.ok {
			t.Errorf("%s: ok %v", c.raw, ok)
			continue
		}
		if !ok {
			continue
		}
		var m keyMeta
		if err := json.Unmarshal([]byte(c.raw), &m); err != nil {
			t.Fatal(err)
		}
		if ns != m.Metadata.Namespace || name != m.Metadata.Name || rv != m.Metadata.ResourceVersion {
			t.Errorf("%s: %q %q %q, json.Unmarshal %q %q %q", c.raw, ns, name, rv, m.Metadata.Namespace, m.Metadata.Name, m.Metadata.ResourceVersion)
		}
	}
}

// A string with many escapes is scanned in linear time (a quadratic scan
// of a 1 MiB string with an escape every 50 bytes took seconds).
func TestFrameScanLinear(t *testing.T) {
	s := strings.Repeat(strings.Repeat("a", 48)+`\n`, 1<<20/50)
	frame := `{"type":"ADDED","object":{"data":{"script":"` + s + `"}}}`
	got, err := readFrames(strings.NewReader(frame))
	if err != io.EOF || len(got) != 1 || len(got[0]) != len(frame) {
		t.Fatalf("%d frames, %v", len(got), err)
	}
	if _, obj, err := eventParts(got[0]); err != nil || len(obj) != len(frame)-len(`{"type":"ADDED","object":`)-1 {
		t.Fatalf("eventParts: %d bytes, %v", len(obj), err)
	}
}

func FuzzFrames(f *testing.F) {
	f.Add([]byte(`{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"b","resourceVersion":"1"}}}` + "\n"))
	f.Add([]byte(`{"a":"\"}\\"} {"b":[{"c":"]"}]}`))
	f.Add([]byte(` {"x":{"y":"\u0041"}}` + "\r\n\t"))
	f.Add([]byte(`{"metadata":{"name":"a","name":"b","resourceVersion":"2"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := readFrames(iotest.HalfReader(bytes.NewReader(data)))
		want, wantErr := jsonFrames(data)
		if wantErr == io.EOF {
			// Valid JSON objects: the same frames, the same clean end.
			valid := true
			for _, w := range want {
				valid = valid && len(w) > 0 && w[0] == '{'
			}
			if valid {
				if err != io.EOF || len(got) != len(want) {
					t.Fatalf("%d frames and %v, json.Decoder %d and EOF", len(got), err, len(want))
				}
				for i := range want {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("frame %d: %q, json.Decoder %q", i, got[i], want[i])
					}
				}
			}
		}
		// Whatever the input: what objectKey and eventParts accept is what
		// json.Unmarshal reads.
		for _, fr := range got {
			if ns, name, rv, ok := objectKey(fr); ok {
				var m keyMeta
				if json.Unmarshal(fr, &m) == nil && (m.Metadata.Namespace != ns || m.Metadata.Name != name || m.Metadata.ResourceVersion != rv) {
					t.Fatalf("objectKey %q %q %q, json.Unmarshal %+v", ns, name, rv, m.Metadata)
				}
			}
			if typ, obj, err := eventParts(fr); err == nil {
				var ev struct {
					Type   *string         `json:"type"`
					Object json.RawMessage `json:"object"`
				}
				if json.Unmarshal(fr, &ev) == nil && ev.Type != nil && (typ != *ev.Type || !bytes.Equal(bytes.TrimSpace(obj), bytes.TrimSpace(ev.Object))) {
					t.Fatalf("eventParts %q %q, json.Unmarshal %q %q", typ, obj, *ev.Type, ev.Object)
				}
			}
		}
	})
}

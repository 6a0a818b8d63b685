package jsonproto

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"reflect"
	goruntime "runtime"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/apitesting/fuzzer"
	metafuzzer "k8s.io/apimachinery/pkg/apis/meta/fuzzer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
)

type marshaler interface{ Marshal() ([]byte, error) }

// typed is the conversion this package replaces: the apiserver's JSON
// serializer into the Go type, then the generated Marshal.
type typed struct{ dec runtime.Serializer }

func newTyped() typed {
	return typed{jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{})}
}

func (tc typed) convert(t reflect.Type, data []byte) ([]byte, error) {
	into := reflect.New(t).Interface()
	if ro, ok := into.(runtime.Object); ok {
		obj, _, err := tc.dec.Decode(data, nil, ro)
		if err != nil {
			return nil, err
		}
		if reflect.TypeOf(obj) != reflect.PointerTo(t) {
			// The JSON names another kind: the serializer decoded that.
			return nil, fmt.Errorf("decoded a %T, not a %s", obj, t)
		}
		return obj.(marshaler).Marshal()
	}
	return nil, fmt.Errorf("%s is not a runtime.Object", t)
}

// builtinKinds are the kinds client-go's scheme knows that have a protobuf
// encoding, sorted for stable test names.
func builtinKinds(t *testing.T) []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	for gvk, rt := range scheme.Scheme.AllKnownTypes() {
		if gvk.Version == runtime.APIVersionInternal {
			continue
		}
		if _, ok := reflect.New(rt).Interface().(marshaler); !ok {
			continue
		}
		out = append(out, gvk)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	if len(out) < 300 {
		t.Fatalf("only %d built-in kinds", len(out))
	}
	return out
}

// TestMatchesTypedConversionForEveryKind fills objects of every built-in
// kind with random values, encodes them as the apiserver does (JSON), and
// requires the plan's message to equal the typed conversion's, byte for
// byte. It also converts the same JSON as PartialObjectMetadata.
func TestMatchesTypedConversionForEveryKind(t *testing.T) {
	perKind := 12
	if testing.Short() {
		perKind = 3
	}
	plans := NewPlans()
	tc := newTyped()
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	fill := fuzzer.FuzzerFor(metafuzzer.Funcs, rand.NewSource(20261121), codecs)
	fill.NilChance(.3).NumElements(0, 3)
	enc := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, jsonserializer.SerializerOptions{})
	meta, err := plans.For(reflect.TypeFor[metav1.PartialObjectMetadata]())
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	compared := 0
	for _, gvk := range builtinKinds(t) {
		rt := scheme.Scheme.AllKnownTypes()[gvk]
		plan, err := plans.For(rt)
		if err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", gvk, err))
			continue
		}
		for i := 0; i < perKind; i++ {
			obj := reflect.New(rt).Interface().(runtime.Object)
			fill.Fill(obj)
			obj.GetObjectKind().SetGroupVersionKind(gvk)
			var buf bytes.Buffer
			if err := enc.Encode(obj, &buf); err != nil {
				t.Fatalf("%s: encode: %v", gvk, err)
			}
			data := buf.Bytes()
			want, err := tc.convert(rt, data)
			if err != nil {
				continue // the JSON of a random object does not always decode (invalid times, ...)
			}
			got, err := plan.Append(nil, data)
			if err != nil {
				t.Errorf("%s #%d: %v\n%s", gvk, i, err, data)
				continue
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s #%d: message differs from the typed conversion\njson: %s\ngot:  %x\nwant: %x", gvk, i, data, got, want)
				continue
			}
			// One prepared conversion, sized, streamed, then appended.
			cv, err := plan.Prepare(data)
			if err != nil || cv.Size() != len(want) {
				t.Fatalf("%s #%d: Prepare: %v, size %v; want %d", gvk, i, err, cv, len(want))
			}
			var streamed bytes.Buffer
			if err := cv.Write(&streamed); err != nil || !bytes.Equal(streamed.Bytes(), want) {
				t.Errorf("%s #%d: Write: %v, equal %v", gvk, i, err, bytes.Equal(streamed.Bytes(), want))
			}
			if again, err := cv.Append(nil); err != nil || !bytes.Equal(again, want) {
				t.Errorf("%s #%d: Append after Write: %v, equal %v", gvk, i, err, bytes.Equal(again, want))
			}
			cv.Release()
			wantMeta, err := tc.convert(reflect.TypeFor[metav1.PartialObjectMetadata](), data)
			if err != nil {
				t.Fatalf("%s #%d: metadata: %v", gvk, i, err)
			}
			gotMeta, err := meta.Append(nil, data)
			if err != nil || !bytes.Equal(gotMeta, wantMeta) {
				t.Errorf("%s #%d: PartialObjectMetadata: %v\ngot:  %x\nwant: %x", gvk, i, err, gotMeta, wantMeta)
			}
			compared++
		}
	}
	t.Logf("%d objects compared; %d kinds refused", compared, len(refused))
	for _, r := range refused {
		t.Errorf("refused: %s", r)
	}
	if compared < 100 {
		t.Errorf("only %d objects compared", compared)
	}
}

// TestEdgeCases: JSON an apiserver writes rarely or never but a decoder
// accepts — each must convert as the typed path does, or be refused.
func TestEdgeCases(t *testing.T) {
	plans := NewPlans()
	tc := newTyped()
	big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0x00, 0x7f}, 50000))
	cases := []struct {
		name   string
		obj    any
		json   string
		refuse bool // the plan must refuse (the typed path decides)
	}{
		{"absent everything", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod"}`, false},
		{"nulls", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","metadata":null,"spec":{"containers":null,"nodeSelector":null,"activeDeadlineSeconds":null,"hostNetwork":null,"overhead":null},"status":null}`, false},
		{"null elements", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","spec":{"containers":[null,{"name":null,"args":["a",null,""]}]}}`, false},
		{"escapes and unicode", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a\u00e9\n\"b","annotations":{"k":"v\\w\ud83d\ude00","l":"\ud800"}},"data":{"x":"\t","y":"é€😀"}}`, false},
		{"invalid utf-8", corev1.ConfigMap{}, "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"data\":{\"x\":\"a\xffb\"}}", false},
		{"map keys unsorted", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","data":{"b":"1","a":"2","c":"","ab":"3"}}`, false},
		{"duplicate map key", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","data":{"b":"1","a":"2","b":"3"}}`, true},
		{"duplicate member", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","name":"b"}}`, true},
		{"escaped member name", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"n\u0061me":"a","labels":{"\u003c":"x","a":"y"}}}`, false},
		{"unknown members dropped", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","nope":{"x":[1,2,{}]}},"extra":true}`, false},
		{"secret data", corev1.Secret{}, `{"apiVersion":"v1","kind":"Secret","data":{"big":"` + big + `","empty":"","nil":null,"pad1":"YWI=","pad2":"YQ=="},"type":"Opaque","immutable":false}`, false},
		{"secret data with line breaks", corev1.Secret{}, `{"apiVersion":"v1","kind":"Secret","data":{"a":"YW\nJj"}}`, false},
		{"secret data escaped", corev1.Secret{}, `{"apiVersion":"v1","kind":"Secret","data":{"a":"YW\u004aj"}}`, false},
		{"bad base64", corev1.Secret{}, `{"apiVersion":"v1","kind":"Secret","data":{"a":"Y!=="}}`, true},
		{"quantities", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":"1000m","memory":" 1Gi ","x":2,"y":null}}}]}}`, false},
		{"int or string", corev1.Service{}, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":80,"targetPort":"http"},{"port":-1,"targetPort":8080},{"targetPort":null}]}}`, false},
		{"times", corev1.Event{}, `{"apiVersion":"v1","kind":"Event","metadata":{"creationTimestamp":"2026-11-21T10:00:00+02:00","deletionTimestamp":"0001-01-01T00:00:00Z"},"firstTimestamp":"1969-12-31T23:59:59Z","eventTime":"2026-11-21T10:00:00.123456Z","lastTimestamp":null}`, false},
		{"fractional times", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","metadata":{"creationTimestamp":"2026-11-21T10:00:00.5Z","deletionTimestamp":"2026-11-21T10:00:00.000000001+01:00"},"status":{"conditions":[{"type":"Ready","lastTransitionTime":"0001-01-01T00:00:00.5Z"}]}}`, false},
		{"micro time", corev1.Event{}, `{"apiVersion":"v1","kind":"Event","eventTime":"2026-11-21T10:00:00.000001Z","series":{"lastObservedTime":"1969-12-31T23:59:59.999999-02:00"}}`, false},
		{"many escapes", corev1.ConfigMap{}, `{"apiVersion":"v1","kind":"ConfigMap","data":{"script":"` + strings.Repeat(`echo \u003cx\u003e \u0026\u0026 \"y\"\\\n`, 2000) + `"}}`, false},
		{"bad time", corev1.Event{}, `{"apiVersion":"v1","kind":"Event","firstTimestamp":"yesterday"}`, true},
		{"raw extension and fields", metav1.PartialObjectMetadata{}, `{"metadata":{"managedFields":[{"manager":"m","fieldsV1":{"f:data": {}},"fieldsType":"FieldsV1"},{"fieldsV1":null}]}}`, false},
		{"int out of range", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","ports":[{"containerPort":4294967296}]}]}}`, true},
		{"float for int", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","spec":{"activeDeadlineSeconds":1.5}}`, true},
		{"string for int", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","spec":{"activeDeadlineSeconds":"1"}}`, true},
		{"number for string", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":1}}`, true},
		{"negative ints", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod","metadata":{"generation":-5},"spec":{"priority":-2147483648}}`, false},
		{"not json", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod",}`, true},
		{"trailing data", corev1.Pod{}, `{"apiVersion":"v1","kind":"Pod"} x`, true},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			rt := reflect.TypeOf(tt.obj)
			plan, err := plans.For(rt)
			if err != nil {
				t.Fatal(err)
			}
			got, gerr := plan.Append([]byte("prefix"), []byte(tt.json))
			if tt.refuse {
				if gerr == nil {
					t.Fatalf("converted, want refused: %x", got)
				}
				if string(got) != "prefix" {
					t.Fatalf("refused but changed dst: %q", got)
				}
				return
			}
			if gerr != nil {
				t.Fatalf("refused: %v", gerr)
			}
			if rt == reflect.TypeFor[metav1.PartialObjectMetadata]() {
				tt.json = `{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata",` + strings.TrimPrefix(tt.json, "{")
			}
			want, err := tc.convert(rt, []byte(tt.json))
			if err != nil {
				t.Fatalf("typed: %v", err)
			}
			if !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("differs\ngot:  %x\nwant: prefix%x", got, want)
			}
		})
	}
}

// FuzzAppend: whatever the JSON, the plan never panics, and when both it
// and the typed conversion accept the JSON they write the same bytes.
func FuzzAppend(f *testing.F) {
	f.Add(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i","ports":[{"containerPort":80}],"resources":{"limits":{"cpu":"1"}}}]}}`)
	f.Add(`{"apiVersion":"v1","kind":"Secret","data":{"a":"YWJj"},"metadata":{"creationTimestamp":"2026-11-21T10:00:00Z","managedFields":[{"fieldsV1":{"f:x":{}}}]}}`)
	f.Add(`{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"targetPort":"x"}]}}`)
	plans := NewPlans()
	tc := newTyped()
	types := []reflect.Type{reflect.TypeFor[corev1.Pod](), reflect.TypeFor[corev1.Secret](), reflect.TypeFor[corev1.Service]()}
	f.Fuzz(func(t *testing.T, data string) {
		for _, rt := range types {
			plan, err := plans.For(rt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := plan.Append(nil, []byte(data))
			if err != nil {
				continue
			}
			want, err := tc.convert(rt, []byte(data))
			if err != nil {
				continue
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: differs for %q\ngot:  %x\nwant: %x", rt, data, got, want)
			}
		}
	})
}

// countingWriter records how a streaming conversion writes.
type countingWriter struct {
	bytes.Buffer
	writes, largest int
	failAfter       int // fail the write that would pass this many bytes (0: never)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.failAfter > 0 && w.Len()+len(b) > w.failAfter {
		return 0, errors.New("client went away")
	}
	w.writes++
	w.largest = max(w.largest, len(b))
	return w.Buffer.Write(b)
}

// TestWriteStreams: Write sends large messages in chunks without a buffer
// of their size (base64 decoded a chunk at a time, long strings written
// from the JSON as they are), can be repeated, and reports a failing
// writer.
func TestWriteStreams(t *testing.T) {
	blob := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x01}, 600<<10)
	secret := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: map[string]string{"big": strings.Repeat("a<b>", 20000)}},
		Data:       map[string][]byte{"a": blob, "b": blob[:5], "c": blob[:100001]}}
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cm"},
		Data:       map[string]string{"x": strings.Repeat("0123456789", 100000), "y": "z"}}
	plans := NewPlans()
	for _, obj := range []runtime.Object{secret, cm} {
		data, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		want, err := obj.(marshaler).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		plan, err := plans.For(reflect.TypeOf(obj).Elem())
		if err != nil {
			t.Fatal(err)
		}
		cv, err := plan.Prepare(data)
		if err != nil || cv.Size() != len(want) {
			t.Fatalf("%T: Prepare: %v", obj, err)
		}
		var w countingWriter
		if err := cv.Write(&w); err != nil || !bytes.Equal(w.Bytes(), want) {
			t.Fatalf("%T: Write: %v, equal %v", obj, err, bytes.Equal(w.Bytes(), want))
		}
		if _, ok := obj.(*corev1.Secret); ok && w.writes < len(want)/(2*chunkBytes) {
			// Base64 is decoded a chunk at a time (a long plain string, as
			// in the ConfigMap, goes out in one write straight from the JSON).
			t.Errorf("%T: %d writes for %d bytes: not streamed", obj, w.writes, len(want))
		}
		// Allocation per Write stays far below the message, and writing a
		// prepared conversion again gives the same bytes.
		var before, after goruntime.MemStats
		goruntime.ReadMemStats(&before)
		for range 5 {
			if err := cv.Write(io.Discard); err != nil {
				t.Fatal(err)
			}
		}
		goruntime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / 5; per > uint64(len(want))/8 {
			t.Errorf("%T: Write allocated %d bytes per call for a %d-byte message", obj, per, len(want))
		}
		var again bytes.Buffer
		if err := cv.Write(&again); err != nil || !bytes.Equal(again.Bytes(), want) {
			t.Errorf("%T: second Write: %v, equal %v", obj, err, bytes.Equal(again.Bytes(), want))
		}
		failing := &countingWriter{failAfter: len(want) / 2}
		if err := cv.Write(failing); err == nil || !strings.Contains(err.Error(), "went away") {
			t.Errorf("%T: Write to a failing writer: %v", obj, err)
		}
		cv.Release()
	}
}

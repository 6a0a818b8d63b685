package shardwire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// readPeeking reads data as a front's list merge does: each record as a
// View when PeekObject gives one (then Skip), else with Next. Views are
// turned into object records so the result compares with readAll's.
func readPeeking(r io.Reader) (recs []Record, views int, err error) {
	rd := NewReader(r)
	for {
		v, ok, err := rd.PeekObject()
		if err != nil {
			return recs, views, err
		}
		if ok {
			views++
			o := &store.Object{Key: string(v.Key), Namespace: string(v.Namespace), Name: string(v.Name), RV: v.RV, Raw: bytes.Clone(v.Raw), ContentHash: v.ContentHash}
			m := &Meta{Key: o.Key, Namespace: o.Namespace, Name: o.Name, RV: o.RV}
			recs = append(recs, Record{Kind: KindObject, Header: Header{Object: m}, Object: o})
			if err := rd.Skip(v); err != nil {
				return recs, views, err
			}
			continue
		}
		rec, err := rd.Next()
		if err != nil {
			return recs, views, err
		}
		recs = append(recs, rec)
	}
}

// itemStream is a list as a shard sends it: items of every size class
// (empty, small, one larger than the read buffer), an object with labels
// (Writer.Object, read with Next), the end.
func itemStream(t testing.TB) []byte {
	big := bytes.Repeat([]byte("x"), 100<<10)
	return encode(t, func(w *Writer) error {
		var errs []error
		for i, raw := range [][]byte{[]byte(`{"a":1}`), nil, invalidUTF8, big, bytes.Repeat([]byte("y"), 60<<10), []byte(`{}`)} {
			errs = append(errs, w.Item(testObj("ns/o"+string(rune('a'+i)), uint64(i+1), raw)))
		}
		errs = append(errs, w.Item(&store.Object{Key: "cluster-scoped", Name: "cluster-scoped", RV: 9, Raw: []byte(`{}`)}))
		// The rest with content hashes, as a front that asks reads them.
		w.SendContentHashes()
		errs = append(errs, w.Item(&store.Object{Key: "ns/hashed", Namespace: "ns", Name: "hashed", RV: 10, Raw: []byte(`{"h":1}`), ContentHash: store.HashContent([]byte(`{"h":1}`))}))
		errs = append(errs, w.Item(&store.Object{Key: "ns/hashed-big", Namespace: "ns", Name: "hashed-big", RV: 11, Raw: big, ContentHash: store.HashContent(big)}))
		errs = append(errs, w.Object(&store.Object{Key: "ns/l", Namespace: "ns", Name: "l", RV: 7, Labels: map[string]string{"k": "v"}, Raw: []byte(`{"l":1}`)}))
		errs = append(errs, w.End(Header{RV: 9, LastKey: "ns/z"}))
		return errors.Join(errs...)
	})
}

func TestPeekObjectReadsWhatNextReads(t *testing.T) {
	data := itemStream(t)
	want, wantErr := readAll(data)
	for name, r := range map[string]io.Reader{
		"whole":        bytes.NewReader(data),
		"byte by byte": iotest.OneByteReader(bytes.NewReader(data)),
		"half":         iotest.HalfReader(bytes.NewReader(data)),
	} {
		got, views, err := readPeeking(r)
		if err != wantErr {
			t.Fatalf("%s: err %v, want %v", name, err, wantErr)
		}
		// Every item but the two larger than the buffer and the one
		// with labels is read in place.
		if views != 7 {
			t.Errorf("%s: %d records read in place, want 7", name, views)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d records, want %d", name, len(got), len(want))
		}
		for i := range want {
			if g, w := canonical(t, got[i]), canonical(t, want[i]); g != w {
				t.Fatalf("%s: record %d:\n got  %s\n want %s", name, i, g, w)
			}
		}
	}
}

// Cut anywhere, a stream read with PeekObject gives what Next gives: the
// whole records before the cut, then io.EOF at a boundary and
// io.ErrUnexpectedEOF inside a record.
func TestPeekObjectTruncatedEverywhere(t *testing.T) {
	data := itemStream(t)
	for cut := 0; cut <= len(data); cut += 1 + cut/64 {
		want, wantErr := readAll(data[:cut])
		got, _, err := readPeeking(bytes.NewReader(data[:cut]))
		if len(got) != len(want) || err != wantErr {
			t.Fatalf("cut at %d/%d: %d records and %v, want %d and %v", cut, len(data), len(got), err, len(want), wantErr)
		}
	}
}

// A view is valid until the reader's next call: the merge copies what it
// keeps. This pins the contract the fleet relies on (a View aliases the
// buffer, so it must not be kept).
func TestViewAliasesTheBuffer(t *testing.T) {
	data := itemStream(t)
	r := NewReader(bytes.NewReader(data))
	v, ok, err := r.PeekObject()
	if err != nil || !ok {
		t.Fatalf("ok %v err %v", ok, err)
	}
	again, _, _ := r.PeekObject()
	if &v.Raw[0] != &again.Raw[0] {
		t.Fatal("two peeks of one record gave different memory")
	}
}

func FuzzPeekObject(f *testing.F) {
	data, ends := sampleStream(f)
	f.Add(data)
	f.Add(itemStream(f))
	start := 0
	for _, e := range ends {
		f.Add(data[start:e])
		start = e
	}
	f.Add([]byte("O\x01a\x00\x01a\x01\x00\x00\x02{}"))
	f.Add([]byte("O\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"))
	f.Add([]byte("H\x01\x02\x03\x04\x05\x06\x07\x08\x01a\x00\x01a\x01\x00\x00\x02{}"))
	f.Add([]byte("H\x01\x02"))
	f.Fuzz(func(t *testing.T, data []byte) {
		want, wantErr := readAll(data)
		got, _, err := readPeeking(bytes.NewReader(data))
		if len(got) != len(want) || (err == nil) != (wantErr == nil) || (err == io.EOF) != (wantErr == io.EOF) {
			t.Fatalf("peeking: %d records and %v; Next: %d records and %v", len(got), err, len(want), wantErr)
		}
		for i := range want {
			if g, w := canonical(t, got[i]), canonical(t, want[i]); g != w {
				t.Fatalf("record %d:\n got  %s\n want %s", i, g, w)
			}
		}
	})
}

// Records written through an Encoder read back through a Decoder, in
// place as well; a cut stream never reads as the whole one.
func TestS2RoundTrip(t *testing.T) {
	c := NewPools()
	var buf bytes.Buffer
	enc := c.Encoder(&buf)
	w := NewWriter(enc)
	plain := itemStream(t)
	want, wantErr := readAll(plain)
	for _, rec := range want {
		if _, err := w.w.Write(reencode(t, rec)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	flushed := buf.Len()
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	if flushed == 0 || flushed != buf.Len() {
		t.Fatalf("Flush sent %d bytes of %d: Writer.Flush must flush the encoder", flushed, buf.Len())
	}
	if buf.Len() >= len(plain)/2 {
		t.Fatalf("%d bytes compressed to %d", len(plain), buf.Len())
	}
	dec, release := c.Decoder(bytes.NewReader(buf.Bytes()))
	got, _, err := readPeeking(dec)
	release()
	if err != wantErr || len(got) != len(want) {
		t.Fatalf("%d records and %v, want %d and %v", len(got), err, len(want), wantErr)
	}
	for i := range want {
		if g, w := canonical(t, got[i]), canonical(t, want[i]); g != w {
			t.Fatalf("record %d:\n got  %s\n want %s", i, g, w)
		}
	}
	// A cut between S2 blocks ends the stream cleanly, like a plain
	// stream cut between records; never with every record read.
	for cut := range buf.Len() {
		dec, release := c.Decoder(bytes.NewReader(buf.Bytes()[:cut]))
		got, _, err := readPeeking(dec)
		release()
		if err == nil || (err == io.EOF && len(got) == len(want)) {
			t.Fatalf("cut at %d/%d: %d records, %v", cut, buf.Len(), len(got), err)
		}
	}
}

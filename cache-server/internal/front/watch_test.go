package front

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cachetier/cachetier/cache-server/internal/metrics"
)

// newWatchTier is newBenchTier with a watch hub, behind an httptest server.
func newWatchTier(t *testing.T, objs [][]byte) string {
	t.Helper()
	bt := newBenchTierFields(t, objs, true, true)
	tier := httptest.NewServer(bt.srv)
	t.Cleanup(func() {
		tier.CloseClientConnections()
		tier.Close()
		bt.stop()
	})
	return tier.URL
}

// watchHead is a watch response's status, encoding headers and its first
// frames: JSON lines up to and including the first initial-events-end
// bookmark, or the first n length-prefixed protobuf frames. The stream is
// read live (the server keeps it open) through Go's gzip reader, as
// net/http decompresses for client-go.
type watchHead struct {
	code            int
	contentEncoding string
	vary            string
	frames          []byte
}

func readWatchHead(t *testing.T, url, accept, acceptEncoding string, protobufFrames int) watchHead {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", accept)
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	// Without DisableCompression the transport would ask for gzip itself
	// and hide the encoding.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := watchHead{code: resp.StatusCode, contentEncoding: resp.Header.Get("Content-Encoding"), vary: resp.Header.Get("Vary")}
	var body io.Reader = resp.Body
	if h.contentEncoding == "gzip" {
		zr, err := gzip.NewReader(resp.Body) // multistream: the members read as one stream
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		body = zr
	}
	br := bufio.NewReader(body)
	var out bytes.Buffer
	if protobufFrames > 0 {
		for range protobufFrames {
			var n [4]byte
			if _, err := io.ReadFull(br, n[:]); err != nil {
				t.Fatalf("%s: after %d bytes: %v", url, out.Len(), err)
			}
			out.Write(n[:])
			if _, err := io.CopyN(&out, br, int64(binary.BigEndian.Uint32(n[:]))); err != nil {
				t.Fatalf("%s: %v", url, err)
			}
		}
	} else {
		for {
			line, err := br.ReadBytes('\n')
			out.Write(line)
			if err != nil {
				t.Fatalf("%s: after %d bytes: %v", url, out.Len(), err)
			}
			if bytes.Contains(line, []byte(`"type":"BOOKMARK"`)) && bytes.Contains(line, []byte(initialEventsEnd)) {
				break
			}
		}
	}
	// The reader may return what it read with the error that ended the
	// request: a stream that stalled (the last frames held back until the
	// next gzip member) shows as the time it took.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("%s, Accept-Encoding %q: the frames took %s to arrive", url, acceptEncoding, d)
	}
	h.frames = out.Bytes()
	return h
}

// A watch-list is gzipped, as kube-apiserver 1.37 does it, when the
// client's Accept-Encoding has a gzip token: the same frames, in gzip
// members that a client reading the live stream can decode up to the
// initial-events-end bookmark. Other watches and watch-lists without gzip
// are not compressed.
func TestWatchListCompression(t *testing.T) {
	const n = 300
	base := newWatchTier(t, benchObjects(n, 2048)) + benchPath
	const pb = "application/vnd.kubernetes.protobuf"

	// Watch-lists: sendInitialEvents=true and allowWatchBookmarks=true,
	// also by the apiserver's defaulting of a watch at RV ""/"0" without
	// resourceVersionMatch (SetListOptionsDefaults, WatchList on).
	for _, tc := range []struct {
		name, query, accept string
		frames              int // protobuf frames to read; 0: JSON up to the bookmark
	}{
		{"json", "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", "application/json", 0},
		{"protobuf", "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan", pb, n + 1},
		{"defaulted rv=0", "?watch=1&resourceVersion=0&allowWatchBookmarks=true", "application/json", 0},
	} {
		plain := readWatchHead(t, base+tc.query, tc.accept, "", tc.frames)
		if plain.code != http.StatusOK || plain.contentEncoding != "" || plain.vary != "" {
			t.Fatalf("%s watch-list without Accept-Encoding: %d, Content-Encoding %q, Vary %q", tc.name, plain.code, plain.contentEncoding, plain.vary)
		}
		if tc.frames == 0 {
			if lines := bytes.Count(plain.frames, []byte("\n")); lines != n+1 {
				t.Fatalf("%s: %d lines up to the bookmark, want %d", tc.name, lines, n+1)
			}
		}
		for _, ae := range []string{"gzip", "deflate, gzip", "br", "gzip;q=1.0"} {
			got := readWatchHead(t, base+tc.query, tc.accept, ae, tc.frames)
			gz := ae == "gzip" || ae == "deflate, gzip"
			if got.code != http.StatusOK || (got.contentEncoding == "gzip") != gz {
				t.Fatalf("%s watch-list, Accept-Encoding %q: %d, Content-Encoding %q", tc.name, ae, got.code, got.contentEncoding)
			}
			if want := map[bool]string{true: "Accept-Encoding"}[gz]; got.vary != want {
				t.Errorf("%s watch-list, Accept-Encoding %q: Vary %q, want %q", tc.name, ae, got.vary, want)
			}
			if !bytes.Equal(got.frames, plain.frames) {
				t.Errorf("%s watch-list, Accept-Encoding %q: frames differ from the uncompressed response (%d vs %d bytes)", tc.name, ae, len(got.frames), len(plain.frames))
			}
		}
	}

	// Initial events without the end bookmark: not watch-lists, never
	// compressed.
	for _, q := range []string{
		"?watch=1&resourceVersion=0",
		"?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
	} {
		got := readWatchHead(t, base+q, pb, "gzip", n)
		if got.code != http.StatusOK || got.contentEncoding != "" || got.vary != "" {
			t.Errorf("%s with gzip: %d, Content-Encoding %q, Vary %q", q, got.code, got.contentEncoding, got.vary)
		}
	}
	// A watch from an RV (the fake apiserver's): only the headers come.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"?watch=1&allowWatchBookmarks=true&resourceVersion="+strconv.Itoa(1000+n), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || resp.Header.Get("Vary") != "" {
		t.Errorf("watch from an RV with gzip: %d, Content-Encoding %q, Vary %q", resp.StatusCode, resp.Header.Get("Content-Encoding"), resp.Header.Get("Vary"))
	}
}

// pipeResponse is a ResponseWriter whose body goes into a pipe, so that a
// test reads it as a client reads a live stream.
type pipeResponse struct {
	h       http.Header
	pw      *io.PipeWriter
	flushes int
}

func (p *pipeResponse) Header() http.Header         { return p.h }
func (p *pipeResponse) WriteHeader(int)             {}
func (p *pipeResponse) Write(b []byte) (int, error) { return p.pw.Write(b) }
func (p *pipeResponse) Flush()                      { p.flushes++ }

// watchBody: every Flush ends a gzip member that a reader of the live
// stream decodes completely before the next member starts (the writer
// waits for the reader between frames), the compressor goes back to the
// pool at each flush and at Close, and a write error is returned.
func TestWatchBodyMembers(t *testing.T) {
	b := newBodyWriters()
	pr, pw := io.Pipe()
	rw := &pipeResponse{h: http.Header{}, pw: pw}
	wb := b.watchBody(rw, http.NewResponseController(rw), true)
	if rw.h.Get("Content-Encoding") != "gzip" || rw.h.Get("Vary") != "Accept-Encoding" {
		t.Fatalf("headers %v", rw.h)
	}
	frames := []string{`{"type":"ADDED","object":{"a":1}}`, `{"type":"BOOKMARK","object":{"b":2}}`, `{"type":"MODIFIED","object":{"c":"` + strings.Repeat("x", 200000) + `"}}`}
	read := make(chan string)
	writerErr := make(chan error, 1)
	go func() {
		for i, f := range frames {
			// Three writes per frame, as watchWriter.frame does.
			for _, part := range []string{f[:10], f[10 : len(f)-1], f[len(f)-1:] + "\n"} {
				if _, err := io.WriteString(wb, part); err != nil {
					writerErr <- err
					return
				}
			}
			if err := wb.Flush(); err != nil {
				writerErr <- err
				return
			}
			if wb.z.gw != nil || wb.z.out != nil || wb.in != nil {
				writerErr <- errors.New("compressor kept after Flush")
				return
			}
			if rw.flushes != i+1 {
				writerErr <- errors.New("response not flushed")
				return
			}
			if got := <-read; got != f+"\n" {
				writerErr <- errors.New("frame read differs")
				return
			}
		}
		// Left open at the end: Close completes the member.
		_, _ = wb.Write([]byte("tail\n"))
		writerErr <- wb.Close()
		_ = wb.Close() // again: nothing
		pw.Close()
	}()
	zr, err := gzip.NewReader(pr)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(zr)
	for range frames {
		lineCh := make(chan string, 1)
		go func() {
			line, _ := br.ReadString('\n')
			lineCh <- line
		}()
		select {
		case line := <-lineCh:
			read <- line
		case err := <-writerErr:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("a flushed frame was not readable before the next member")
		}
	}
	rest, err := io.ReadAll(br) // until the writer closes the pipe
	if err := <-writerErr; err != nil {
		t.Fatal(err)
	}
	if err != nil || string(rest) != "tail\n" {
		t.Fatalf("after Close: %q, %v", rest, err)
	}

	// A write error (the client went away) is returned by the writes or at
	// the latest by Flush, and the compressor still goes back to the pool.
	pr, pw = io.Pipe()
	pr.CloseWithError(errors.New("gone"))
	rw = &pipeResponse{h: http.Header{}, pw: pw}
	wb = b.watchBody(rw, http.NewResponseController(rw), true)
	_, werr := wb.Write([]byte(strings.Repeat("y", 1<<20)))
	ferr := wb.Flush()
	if werr == nil && ferr == nil {
		t.Fatal("write error not reported")
	}
	if wb.z.gw != nil {
		t.Fatal("compressor kept after a failed Flush")
	}

	// Uncompressed: writes go through, Flush flushes, no headers.
	var buf bytes.Buffer
	rec := httptest.NewRecorder()
	rec.Body = &buf
	wb = b.watchBody(rec, http.NewResponseController(rec), false)
	_, _ = io.WriteString(wb, "a\n")
	if err := wb.Flush(); err != nil || !rec.Flushed || buf.String() != "a\n" || rec.Header().Get("Content-Encoding") != "" {
		t.Fatalf("plain: %v %v %q %v", err, rec.Flushed, buf.String(), rec.Header())
	}
}

// countingResponse records each Write the ResponseWriter gets.
type countingResponse struct {
	h      http.Header
	writes []string
	err    error
}

func (c *countingResponse) Header() http.Header { return c.h }
func (c *countingResponse) WriteHeader(int)     {}
func (c *countingResponse) Flush()              {}
func (c *countingResponse) Write(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.writes = append(c.writes, string(b))
	return len(b), nil
}

// An uncompressed watch stream writes each event of up to eventCoalesceMax
// in one Write (its frame's pieces gathered), a larger one in its pieces,
// the same bytes either way; a failed Write is returned and a partly
// gathered event is dropped by Close.
func TestWatchBodyGathersEvents(t *testing.T) {
	b := newBodyWriters()
	rw := &countingResponse{h: http.Header{}}
	wb := b.watchBody(rw, http.NewResponseController(rw), false)
	ww := &watchWriter{s: &Server{opts: Options{Metrics: metrics.New(prometheus.NewRegistry())}}, w: wb, res: &resource{label: "pods"}, enc: encJSON}
	small := []byte(`{"kind":"Pod","metadata":{"name":"` + strings.Repeat("p", 5000) + `"}}` + "\n")
	large := []byte(`{"kind":"Pod","metadata":{"name":"` + strings.Repeat("q", eventCoalesceMax) + `"}}`)
	for _, obj := range [][]byte{small, large, small} {
		if err := ww.frame("MODIFIED", obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"type":"MODIFIED","object":` + string(bytes.TrimRight(small, "\n")) + "}\n",
		`{"type":"MODIFIED","object":`, string(large), "}\n",
		`{"type":"MODIFIED","object":` + string(bytes.TrimRight(small, "\n")) + "}\n",
	}
	if len(rw.writes) != len(want) {
		t.Fatalf("%d writes, want %d (one per small event, three for the large one)", len(rw.writes), len(want))
	}
	for i := range want {
		if rw.writes[i] != want[i] {
			t.Fatalf("write %d: %.60q…, want %.60q…", i, rw.writes[i], want[i])
		}
	}

	rw.err = errors.New("gone")
	if err := ww.frame("ADDED", small); err == nil {
		t.Fatal("a failed write was not returned")
	}
	if wb.event != nil {
		t.Fatal("event kept after a failed write")
	}
	_, _ = io.WriteString(wb, "partial")
	_ = wb.Close()
	if wb.event != nil {
		t.Fatal("a partly gathered event kept after Close")
	}
}

// A gzipped JSON watch-list's initial events come from the compressed
// chunks kept between watch-lists: the second one of the same objects
// compresses nothing again, and both decode to the uncompressed
// response's frames. Initial events without the end bookmark, and
// protobuf, are written event by event as before (TestWatchListCompression).
func TestWatchListInitialEventsFromKeptChunks(t *testing.T) {
	const n = 2000
	bt := newBenchTierFields(t, benchObjects(n, 1024), true, true)
	tier := httptest.NewServer(bt.srv)
	t.Cleanup(func() {
		tier.CloseClientConnections()
		tier.Close()
		bt.stop()
	})
	url := tier.URL + benchPath + "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
	chunks := func(result string) float64 {
		return testutil.ToFloat64(bt.metrics.ListGzipChunks.WithLabelValues("configmaps", result))
	}
	plain := readWatchHead(t, url, "application/json", "", 0)
	if chunks("miss")+chunks("hit") != 0 {
		t.Fatalf("an uncompressed watch-list used chunks: %v misses, %v hits", chunks("miss"), chunks("hit"))
	}
	cold := readWatchHead(t, url, "application/json", "gzip", 0)
	misses := chunks("miss")
	if cold.contentEncoding != "gzip" || !bytes.Equal(cold.frames, plain.frames) {
		t.Fatalf("first gzipped watch-list: Content-Encoding %q, frames equal to the plain ones: %v", cold.contentEncoding, bytes.Equal(cold.frames, plain.frames))
	}
	if misses < n/chunkItemsApprox/2 || chunks("hit") != 0 {
		t.Fatalf("first gzipped watch-list: %v chunks compressed, %v taken from the cache; want ~%d compressed", misses, chunks("hit"), n/chunkItemsApprox)
	}
	warm := readWatchHead(t, url, "application/json", "gzip", 0)
	if !bytes.Equal(warm.frames, plain.frames) {
		t.Fatal("second gzipped watch-list: frames differ from the plain ones")
	}
	if chunks("miss") != misses || chunks("hit") != misses {
		t.Fatalf("second gzipped watch-list: %v more compressed, %v from the cache; want 0 and %v", chunks("miss")-misses, chunks("hit"), misses)
	}
	if got := testutil.ToFloat64(bt.metrics.WatchEvents.WithLabelValues("configmaps", "ADDED")); got != 3*n {
		t.Errorf("ADDED events counted: %v, want %d", got, 3*n)
	}
}

// chunkItemsApprox is gzipchunks' average chunk length in objects.
const chunkItemsApprox = 64

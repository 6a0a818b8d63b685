package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	rtrace "runtime/trace"
	"testing"
	"time"
)

// slowList is the handler the test marks; the request with ?slow=1 waits
// in it, so that request is the slowest.
//
//go:noinline
func slowList(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("slow") != "" {
		time.Sleep(30 * time.Millisecond)
	}
	_, _ = w.Write(bytes.Repeat([]byte("x"), 20<<10))
}

// TestExplain traces one process that is both the client (regions around
// its requests) and an HTTP/2 server, and checks that the slow request is
// found, matched with its handler, and split into parts that add up.
func TestExplain(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/list" {
			slowList(w, r)
			return
		}
		_, _ = io.WriteString(w, "other")
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := srv.Client()

	var buf bytes.Buffer
	if err := rtrace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	get := func(path string) {
		defer rtrace.StartRegion(context.Background(), "req").End()
		resp, err := c.Get(srv.URL + path)
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for i := range 5 {
		get("/list")
		if i == 2 {
			get("/list?slow=1")
		}
	}
	get("/other") // runs no marked handler
	rtrace.Stop()

	client, err := parse(bytes.NewReader(buf.Bytes()), "", "req")
	if err != nil {
		t.Fatal(err)
	}
	server, err := parse(bytes.NewReader(buf.Bytes()), "tracewaits.slowList", "req")
	if err != nil {
		t.Fatal(err)
	}
	if len(client.regions) != 7 {
		t.Fatalf("%d regions, want 7", len(client.regions))
	}
	all := explain(client, server)
	slow := all[0]
	if !slow.handled || slow.handler < 30*time.Millisecond {
		t.Fatalf("slowest: %+v; want matched with a handler of at least 30 ms", slow)
	}
	if sum := slow.toNoticed + slow.toHandler + slow.handler + slow.after; sum != slow.total {
		t.Errorf("parts add up to %v, the request took %v", sum, slow.total)
	}
	// The connection's frame reader woke on the request's bytes before
	// the serve goroutine started the handler.
	if slow.toHandler <= 0 {
		t.Errorf("no time from the server's reader waking to the handler: %+v; the reader was not found", slow)
	}
	if slow.toNoticed < 0 || slow.toHandler < 0 || slow.after < 0 {
		t.Errorf("a negative part: %+v", slow)
	}
	matched := 0
	for _, b := range all {
		if b.handled {
			matched++
			if b.handler > b.total {
				t.Errorf("handler %v longer than its request %v", b.handler, b.total)
			}
		}
	}
	if matched != 6 {
		t.Errorf("%d requests matched with a handler, want the 6 of /list", matched)
	}
}

func TestParseRejectsGarbage(t *testing.T) {
	if _, err := parse(bytes.NewReader([]byte("not a trace")), "", "req"); err == nil {
		t.Fatal("parsed garbage")
	}
}

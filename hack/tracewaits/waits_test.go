package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	rtrace "runtime/trace"
	"sync"
	"testing"
	"time"
)

// slowList is the handler the test marks; the request with ?slow=1 waits
// in it, so that request is the slowest. Every request sleeps in it a
// little: a goroutine is known to run it only from a traced stack (a
// wait, a CPU sample), and a handler whose writes never block leaves none.
//
//go:noinline
func slowList(w http.ResponseWriter, r *http.Request) {
	wait := time.Millisecond
	if r.URL.Query().Get("slow") != "" {
		wait = 30 * time.Millisecond
	}
	time.Sleep(wait)
	_, _ = w.Write(bytes.Repeat([]byte("x"), 20<<10))
}

// TestExplain traces one process that is both the client (regions around
// its requests) and an HTTP/2 server, and checks that the slow request is
// found, matched with its handler, and split into parts that add up.
func TestExplain(t *testing.T) {
	var handlers sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
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
	// A client can read a response's last frame before its handler's
	// goroutine exits; on a busy machine the exit of the last may be
	// later than the trace's end without this wait.
	handlers.Wait()
	time.Sleep(20 * time.Millisecond)
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
	// The slow request is matched with its handler. It is not always the
	// slowest: on a busy machine a fast one can wait longer for the CPU.
	// The connection's frame reader woke on a request's bytes before the
	// serve goroutine started its handler (found): not on every request,
	// as a reader still busy with the previous frames finds the bytes
	// without waiting (about one request in 25 here), and then nothing
	// marks when the server saw them.
	slow, found, matched := 0, 0, 0
	for _, b := range all {
		if !b.handled {
			continue
		}
		matched++
		if b.handler >= 30*time.Millisecond {
			slow++
		}
		if b.toHandler > 0 {
			found++
		}
		if sum := b.toNoticed + b.toHandler + b.handler + b.after; sum != b.total {
			t.Errorf("parts add up to %v, the request took %v", sum, b.total)
		}
		if b.toNoticed < 0 || b.toHandler < 0 || b.after < 0 {
			t.Errorf("a negative part: %+v", b)
		}
	}
	if slow != 1 {
		t.Errorf("%d requests matched with a handler of at least 30 ms, want 1: %+v", slow, all)
	}
	if found == 0 {
		t.Errorf("no request's reader found: %+v", all)
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

package main

import (
	"bytes"
	"math"
	"testing"

	"github.com/google/pprof/profile"
)

// TestSplitCPUProfile: a sample counts as watch serving if any frame of
// its stack serves a watch (before connection writes), as connection
// writes if any frame writes the connection's frames, and in the total
// always.
func TestSplitCPUProfile(t *testing.T) {
	fns := map[string]*profile.Function{}
	loc := func(name string) *profile.Location {
		f, ok := fns[name]
		if !ok {
			f = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
			fns[name] = f
		}
		return &profile.Location{Line: []profile.Line{{Function: f}}}
	}
	sample := func(ms int64, stack ...string) *profile.Sample {
		s := &profile.Sample{Value: []int64{1, ms * 1e6}}
		for _, name := range stack {
			s.Location = append(s.Location, loc(name))
		}
		return s
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     1e7,
		Sample: []*profile.Sample{
			// The watch handler encoding an event.
			sample(30, "encoding/json.Marshal", "k8s.io/apiserver/pkg/endpoints/handlers.(*watchEncoder).Encode", "k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP", "net/http.HandlerFunc.ServeHTTP"),
			// The cacher handing an event to a watcher.
			sample(10, "runtime.chansend", "k8s.io/apiserver/pkg/storage/cacher.(*cacheWatcher).nonblockingAdd", "k8s.io/apiserver/pkg/storage/cacher.(*Cacher).dispatchEvent", "k8s.io/apiserver/pkg/storage/cacher.(*Cacher).dispatchEvents"),
			// The connection's TLS write of a frame.
			sample(20, "crypto/tls.(*Conn).Write", "golang.org/x/net/http2.(*serverConn).writeFrameAsync"),
			// The write itself: a PATCH's update, the watch cache's
			// processing of its event (not dispatch: it happens with no
			// watcher).
			sample(100, "k8s.io/apiserver/pkg/storage/cacher.(*CacheDelegator).GuaranteedUpdate"),
			sample(5, "k8s.io/apiserver/pkg/storage/cacher.(*watchCache).processEvent"),
			// A watch handler's own frame write is watch serving, once.
			sample(7, "golang.org/x/net/http2.(*serverConn).scheduleFrameWrite", "k8s.io/apiserver/pkg/endpoints/handlers.serveWatch"),
		},
	}
	for _, s := range p.Sample {
		for _, l := range s.Location {
			p.Location = append(p.Location, l)
		}
	}
	for i, l := range p.Location {
		l.ID = uint64(i + 1)
	}
	for _, f := range fns {
		p.Function = append(p.Function, f)
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := splitCPUProfile(&buf)
	if err != nil {
		t.Fatal(err)
	}
	want := cpuSplit{total: 172, watch: 47, conn: 20, ok: true}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !got.ok || !near(got.total, want.total) || !near(got.watch, want.watch) || !near(got.conn, want.conn) {
		t.Errorf("split = %+v, want %+v", got, want)
	}

	if _, err := splitCPUProfile(bytes.NewReader([]byte("not a profile"))); err == nil {
		t.Error("garbage parsed as a profile")
	}
	heap := &profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}}
	buf.Reset()
	if err := heap.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := splitCPUProfile(&buf); err == nil {
		t.Error("a heap profile split as CPU")
	}
}

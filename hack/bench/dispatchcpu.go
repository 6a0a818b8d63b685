package main

// The apiserver's watch dispatch, read from its CPU profile.
//
// -mode nodes compares the tier's CPU per update with what kube-apiserver
// spends dispatching the same update to its own watchers. Taken as the
// difference of two process totals (the apiserver's CPU per write with W
// watchers minus with none), that figure is 0-1 ms beside 4-6 ms per write
// that drifts by up to 2 ms between two writer-alone runs of one bench: it
// came out negative as often as not. A CPU profile of the apiserver over
// the same window says where the time went instead: the samples whose
// stacks are serving a watch (the watch handler's encode and write, the
// cacher's dispatch to its watchers) are the dispatch, whatever the writes
// cost around them.
//
// Two parts are there without the bench's watchers too: the control
// plane's own watchers of Pods (kube-controller-manager's and the
// scheduler's informers get every update), and the HTTP/2 connections'
// frame writes (TLS) and frame scheduling, which run on the connection's
// goroutines for watch events and the writer's PATCH responses alike. So
// the dispatch is a phase's watch serving and frame writes minus the
// writer-alone runs' (interpolated in time, as the totals are): a
// difference again, but of figures ten times smaller than the totals.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/pprof/profile"
	"k8s.io/client-go/rest"
)

// watchServing are the function-name prefixes of kube-apiserver's watch
// serving (k8s.io/apiserver 1.37): a watch request's handler goroutine,
// which encodes each event (through the cacher's per-event serialization
// cache) and writes it to the response, and the cacher's dispatch of an
// event to its watchers (by index, then each watcher's buffer and its
// goroutine).
var watchServing = []string{
	"k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).",
	"k8s.io/apiserver/pkg/endpoints/handlers.handleWatch",
	"k8s.io/apiserver/pkg/endpoints/handlers.serveWatch",
	"k8s.io/apiserver/pkg/storage/cacher.(*cacheWatcher).",
	"k8s.io/apiserver/pkg/storage/cacher.(*Cacher).dispatchEvent",
	"k8s.io/apiserver/pkg/storage/cacher.(*Cacher).startDispatching",
	"k8s.io/apiserver/pkg/storage/cacher.(*Cacher).finishDispatching",
}

// connWriting are the HTTP/2 connection's frame writing and scheduling,
// shared by every response on the connection.
var connWriting = []string{
	"golang.org/x/net/http2.(*serverConn).writeFrameAsync",
	"golang.org/x/net/http2.(*serverConn).scheduleFrameWrite",
	"golang.org/x/net/http2.(*serverConn).wroteFrame",
}

// cpuSplit is a CPU profile's time, in ms, split by what the stacks were
// doing. Each sample is counted once: in watch if any frame serves a
// watch, else in conn if any frame writes the connection's frames.
type cpuSplit struct {
	total, watch, conn float64
	// ok: a profile was read (the apiserver serves profiles).
	ok bool
}

// splitCPUProfile reads a CPU profile (pprof's gzipped protobuf).
func splitCPUProfile(r io.Reader) (cpuSplit, error) {
	p, err := profile.Parse(r)
	if err != nil {
		return cpuSplit{}, err
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			vi = i
		}
	}
	if vi < 0 {
		return cpuSplit{}, fmt.Errorf("not a CPU profile (sample types %v)", p.SampleType)
	}
	matches := func(s *profile.Sample, prefixes []string) bool {
		for _, loc := range s.Location {
			for _, line := range loc.Line {
				if line.Function == nil {
					continue
				}
				for _, pre := range prefixes {
					if strings.HasPrefix(line.Function.Name, pre) {
						return true
					}
				}
			}
		}
		return false
	}
	split := cpuSplit{ok: true}
	for _, s := range p.Sample {
		ms := float64(s.Value[vi]) / 1e6
		split.total += ms
		switch {
		case matches(s, watchServing):
			split.watch += ms
		case matches(s, connWriting):
			split.conn += ms
		}
	}
	return split, nil
}

// profileAPIServer takes a CPU profile of the apiserver for d and splits
// it. A copy goes to file when file is not empty. An apiserver that serves
// no profiles gives a split that is not ok, and no error.
func profileAPIServer(cfg *rest.Config, d time.Duration, file string) (cpuSplit, error) {
	body, err := cpuProfile(cfg, d)
	if err != nil || body == nil {
		return cpuSplit{}, err
	}
	if file != "" {
		if err := os.WriteFile(file, body, 0o644); err != nil {
			return cpuSplit{}, err
		}
		fmt.Fprintf(os.Stderr, "bench: wrote %s\n", file)
	}
	return splitCPUProfile(bytes.NewReader(body))
}

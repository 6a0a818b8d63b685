package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// span is one stretch of a goroutine in one state.
type span struct {
	state      trace.GoState
	start, end trace.Time
	// reason is why the goroutine waits (Waiting spans: "network",
	// "select", ...); prevReason, on a Runnable span, is the reason of the
	// wait it came out of.
	reason, prevReason string
	// waker is the goroutine that made it runnable (Runnable spans).
	waker trace.GoID
	stack string
}

func (s span) d() time.Duration { return time.Duration(s.end - s.start) }

// goroutine is one goroutine's life in a trace.
type goroutine struct {
	id, creator    trace.GoID
	created, ended trace.Time // zero: before / after the trace
	spans          []span
	marked         bool // ran the function asked for
	open           *span
	lastWaitReason string
	// assists are the goroutine's GC mark assists: allocating while the
	// collector marks, it was made to mark in proportion.
	assists     time.Duration
	assistBegan trace.Time
}

// region is one instance of a user region (runtime/trace.StartRegion).
type region struct {
	g          trace.GoID
	start, end trace.Time
}

// parsed is what one trace holds for the breakdown.
type parsed struct {
	gs      map[trace.GoID]*goroutine
	regions []region
}

// parse reads a runtime/trace stream: every goroutine's states, which of
// them ran a function whose name contains mark, and the regions of type
// regionType.
func parse(r io.Reader, mark, regionType string) (*parsed, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return nil, err
	}
	p := &parsed{gs: map[trace.GoID]*goroutine{}}
	open := map[trace.GoID]trace.Time{}
	marked := func(s trace.Stack) bool {
		if mark == "" {
			return false
		}
		for f := range s.Frames() {
			if strings.Contains(f.Func, mark) {
				return true
			}
		}
		return false
	}
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch ev.Kind() {
		case trace.EventRegionBegin:
			if ev.Region().Type == regionType {
				open[ev.Goroutine()] = ev.Time()
			}
		case trace.EventRegionEnd:
			if t, ok := open[ev.Goroutine()]; ok && ev.Region().Type == regionType {
				p.regions = append(p.regions, region{ev.Goroutine(), t, ev.Time()})
				delete(open, ev.Goroutine())
			}
		case trace.EventRangeBegin, trace.EventRangeEnd:
			rg := ev.Range()
			if rg.Name != "GC mark assist" || rg.Scope.Kind != trace.ResourceGoroutine {
				continue
			}
			g := p.gs[rg.Scope.Goroutine()]
			if g == nil {
				continue
			}
			if ev.Kind() == trace.EventRangeBegin {
				g.assistBegan = ev.Time()
			} else if g.assistBegan != 0 {
				g.assists += time.Duration(ev.Time() - g.assistBegan)
				g.assistBegan = 0
			}
		case trace.EventStackSample:
			if g := p.gs[ev.Goroutine()]; g != nil && marked(ev.Stack()) {
				g.marked = true
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			id := st.Resource.Goroutine()
			from, to := st.Goroutine()
			g := p.gs[id]
			if g == nil || from == trace.GoNotExist {
				g = &goroutine{id: id}
				if from == trace.GoNotExist {
					g.created, g.creator = ev.Time(), ev.Goroutine()
				}
				p.gs[id] = g
			}
			if marked(st.Stack) {
				g.marked = true
			}
			if g.open != nil {
				g.open.end = ev.Time()
				g.spans = append(g.spans, *g.open)
				g.open = nil
			}
			if to == trace.GoNotExist {
				g.ended = ev.Time()
				continue
			}
			s := &span{state: to, start: ev.Time(), reason: st.Reason}
			if to == trace.GoRunnable {
				s.prevReason = g.lastWaitReason
				if from == trace.GoWaiting {
					s.waker = ev.Goroutine()
				}
			}
			switch to {
			case trace.GoWaiting:
				// A wait may be traced in two steps, the second without
				// its reason: keep the first's.
				if st.Reason != "" {
					g.lastWaitReason = st.Reason
				}
				s.stack = frames(st.Stack, 4)
			case trace.GoRunning:
				g.lastWaitReason = ""
			}
			g.open = s
		}
	}
	return p, nil
}

// frames is the innermost n functions of s, without their packages'
// paths, innermost first.
func frames(s trace.Stack, n int) string {
	var out []string
	for f := range s.Frames() {
		fn := f.Func
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		out = append(out, fn)
		if len(out) == n {
			break
		}
	}
	return strings.Join(out, " < ")
}

// breakdown is where one client request's time went, on both sides.
type breakdown struct {
	total time.Duration
	// handled: the server ran a handler for it (else only total is set).
	handled bool
	// toNoticed: from the client's start until the server's connection
	// reader was woken by the request's bytes (the client's send and the
	// server's network poll).
	toNoticed time.Duration
	// toHandler: from then until the handler goroutine started (the
	// server's connection goroutines).
	toHandler time.Duration
	// handler: the handler goroutine's life (cut at the request's end
	// when its exit is traced after it), and how much of it it spent
	// runnable (waiting for a P) or waiting on the connection's serve
	// goroutine to take its writes.
	handler, handlerRunnable, handlerWrites time.Duration
	// handlerAssists: of the handler's running time, GC mark assists.
	handlerAssists time.Duration
	// after: from the handler's end until the client's region ended
	// (the last frames' write, the client's network poll and read).
	after time.Duration
	// clientNoticed: when the client's connection reader was last woken
	// by network bytes within the region, measured from the handler's
	// end (negative: before it ended).
	clientNoticed time.Duration
}

// explain matches each client region with the server's handler goroutine
// (marked) that started within it, and breaks the region down. Both
// traces must come from one machine: Go trace times are the monotonic
// clock (CLOCK_MONOTONIC on Linux), shared by processes.
func explain(client, server *parsed) []breakdown {
	var handlers []*goroutine
	for _, g := range server.gs {
		if g.marked && g.created != 0 && g.ended != 0 {
			handlers = append(handlers, g)
		}
	}
	slices.SortFunc(handlers, func(a, b *goroutine) int { return int(a.created - b.created) })
	var out []breakdown
	for _, r := range client.regions {
		b := breakdown{total: time.Duration(r.end - r.start)}
		h := handlerOf(handlers, r)
		if h != nil {
			b.handled = true
			ended := min(h.ended, r.end)
			b.handler = time.Duration(ended - h.created)
			b.handlerAssists = h.assists
			for _, s := range h.spans {
				switch {
				case s.state == trace.GoRunnable:
					b.handlerRunnable += s.d()
				case s.state == trace.GoWaiting && strings.Contains(s.stack, "serverConn).write"):
					b.handlerWrites += s.d()
				}
			}
			noticed := h.created
			if serve := server.gs[h.creator]; serve != nil {
				noticed = readerWoke(server, serve, r.start, h.created)
			}
			b.toNoticed = time.Duration(noticed - r.start)
			b.toHandler = time.Duration(h.created - noticed)
			b.after = time.Duration(r.end - ended)
			b.clientNoticed = time.Duration(lastNetworkWake(client, r) - ended)
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b breakdown) int { return int(b.total - a.total) })
	return out
}

// exitGrace is how long after a client's request ended its handler
// goroutine's exit may be traced: the handler's last frame is on the wire
// before the handler returns, so a client that reads it promptly can end
// first, by more than 2 ms on a busy machine.
const exitGrace = 10 * time.Millisecond

// handlerOf is the marked handler (handlers sorted by start) that served
// the region: the first that both started and ended within it (a flood's
// LISTs run the same handler, longer), else the first that started
// within it and exited less than exitGrace after it.
func handlerOf(handlers []*goroutine, r region) *goroutine {
	first, _ := slices.BinarySearchFunc(handlers, r.start, func(g *goroutine, t trace.Time) int { return int(g.created - t) })
	for _, limit := range []trace.Time{r.end, r.end + trace.Time(exitGrace)} {
		for i := first; i < len(handlers) && handlers[i].created <= r.end; i++ {
			if handlers[i].ended <= limit {
				return handlers[i]
			}
		}
	}
	return nil
}

// readerWoke is when the connection's frame reader — of the goroutines
// that woke serve before the handler started, the latest that had itself
// just left a network wait — was woken: when the server's runtime saw the
// request's bytes. Without one, it is the handler's start.
func readerWoke(p *parsed, serve *goroutine, from, handlerStart trace.Time) trace.Time {
	// The wakes of serve before the handler, latest first: the frame
	// reader's, unlike a frame writer's, follows a network wait.
	for i := len(serve.spans) - 1; i >= 0; i-- {
		s := serve.spans[i]
		if s.state != trace.GoRunnable || s.waker == 0 || s.start < from || s.start > handlerStart {
			continue
		}
		reader := p.gs[s.waker]
		if reader == nil {
			continue
		}
		woke := trace.Time(0)
		for _, rs := range reader.spans {
			if rs.state == trace.GoRunnable && rs.prevReason == "network" && rs.start >= from && rs.start <= s.start {
				woke = rs.start
			}
		}
		if woke != 0 {
			return woke
		}
	}
	return handlerStart
}

// lastNetworkWake is when the client's connection reader — the goroutine
// that last woke the region's goroutine — last left a network wait before
// that: when the client's runtime saw the response's last bytes. Without
// one, it is r's end.
func lastNetworkWake(p *parsed, r region) trace.Time {
	g := p.gs[r.g]
	if g == nil {
		return r.end
	}
	var reader *goroutine
	var woken trace.Time
	for _, s := range g.spans {
		if s.state == trace.GoRunnable && s.waker != 0 && s.start >= r.start && s.start <= r.end {
			reader, woken = p.gs[s.waker], s.start
		}
	}
	if reader == nil {
		return r.end
	}
	last := r.end
	for _, s := range reader.spans {
		if s.state == trace.GoRunnable && s.prevReason == "network" && s.start >= r.start && s.start <= woken {
			last = s.start
		}
	}
	return last
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

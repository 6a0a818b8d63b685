package main

// What the watch benchmarks that time delivery share (-mode fanout,
// -mode nodes): a writer that stamps every update with the time it is
// sent, the reading of newline-framed JSON watch events, and the latency
// histogram (receive time − the update's stamp) per watcher and merged.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// writtenAt is the annotation carrying an update's write time (UnixNano).
const writtenAt = "bench.cachetier.io/written-at"

var writtenAtMarker = []byte(`"` + writtenAt + `":"`)

// stampOf is the writtenAt stamp in an event's JSON, if it carries one.
func stampOf(event []byte) (int64, bool) {
	i := bytes.Index(event, writtenAtMarker)
	if i < 0 {
		return 0, false
	}
	rest := event[i+len(writtenAtMarker):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return 0, false
	}
	ts, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return ts, err == nil
}

// Latency histogram: bucket i holds latencies in [g^i, g^(i+1)) µs,
// g = 1.02 (2% resolution, up to ~10^8 µs).
const (
	histGrowth  = 1.02
	histBuckets = 1000
)

var logGrowth = math.Log(histGrowth)

func histIndex(us int64) int {
	if us < 1 {
		return 0
	}
	return min(int(math.Log(float64(us))/logGrowth), histBuckets-1)
}

// latencyCounts is one watcher's histogram (uint32: a thousand watchers
// keep one each).
type latencyCounts [histBuckets]uint32

// record counts an event received at recv that was written at stamp
// (UnixNano).
func (h *latencyCounts) record(recv time.Time, stamp int64) {
	h[histIndex((recv.UnixNano()-stamp)/1000)]++
}

// latencies merges watchers' histograms.
type latencies struct {
	counts [histBuckets]uint64
	n      uint64
	top    int
}

func (l *latencies) add(h *latencyCounts) {
	for i, c := range h {
		if c > 0 {
			l.counts[i] += uint64(c)
			l.n += uint64(c)
			l.top = max(l.top, i)
		}
	}
}

// quantile is the upper edge of the bucket holding the p-quantile (0 when
// nothing was recorded).
func (l *latencies) quantile(p float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	want := max(uint64(math.Ceil(p*float64(l.n))), 1)
	var acc uint64
	for i, c := range l.counts {
		acc += c
		if acc >= want {
			return bucketEdge(i)
		}
	}
	return 0
}

// max is the upper edge of the highest bucket used.
func (l *latencies) max() time.Duration {
	if l.n == 0 {
		return 0
	}
	return bucketEdge(l.top)
}

func bucketEdge(i int) time.Duration {
	return time.Duration(math.Pow(histGrowth, float64(i+1)) * float64(time.Microsecond))
}

// eventReader reads newline-framed JSON watch events (both servers frame
// JSON watch events one per line).
type eventReader struct {
	br   *bufio.Reader
	line []byte
}

func newEventReader(r io.Reader) *eventReader {
	return &eventReader{br: bufio.NewReaderSize(r, 16<<10)}
}

// next returns the next event, valid until the following call.
func (r *eventReader) next() ([]byte, error) {
	r.line = r.line[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			r.line = append(r.line, chunk...)
			continue
		}
		if err != nil {
			if err == io.EOF {
				return nil, errors.New("stream ended (EOF)")
			}
			return nil, err
		}
		if len(r.line) > 0 {
			r.line = append(r.line, chunk...)
			return r.line, nil
		}
		return chunk, nil
	}
}

// errorEvent reports an ERROR watch event as an error.
func errorEvent(event []byte) error {
	if bytes.Contains(event[:min(len(event), 64)], []byte(`"ERROR"`)) {
		return fmt.Errorf("ERROR event: %s", event[:min(len(event), 512)])
	}
	return nil
}

// writeResult is what writeLoop did.
type writeResult struct {
	writes, dropped, failed int64
	// lat is each successful write's round trip in ms.
	lat []float64
}

// writeLoop calls write(i) for i = 0, 1, ... at rate per second for
// duration, from writers goroutines; a tick that finds every writer busy
// is dropped and counted. Each write stamps writtenAt itself, with the
// time it is sent.
func writeLoop(ctx context.Context, rate int, duration time.Duration, writers int, write func(ctx context.Context, i int) error) writeResult {
	var res writeResult
	var w, f atomic.Int64
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	for range max(writers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sent := time.Now()
				if err := write(ctx, i); err != nil {
					if f.Add(1) == 1 {
						fmt.Fprintln(os.Stderr, "bench: write failed:", err)
					}
					continue
				}
				w.Add(1)
				d := ms(time.Since(sent))
				mu.Lock()
				res.lat = append(res.lat, d)
				mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	end := time.After(duration)
	n := 0
loop:
	for {
		select {
		case <-end:
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			select {
			case work <- n:
				n++
			default:
				res.dropped++
			}
		}
	}
	tick.Stop()
	close(work)
	wg.Wait()
	res.writes, res.failed = w.Load(), f.Load()
	return res
}

// stampPatch is a merge patch setting writtenAt to now.
func stampPatch() []byte {
	return []byte(`{"metadata":{"annotations":{"` + writtenAt + `":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}}}`)
}

// openGet sends GET u asking for JSON and returns the response if it is
// 200 OK, else an error with the server's answer (the body closed).
func openGet(ctx context.Context, c *http.Client, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %d %s", u, resp.StatusCode, b)
	}
	return resp, nil
}

// getJSON decodes the JSON answer to GET u into v.
func getJSON(ctx context.Context, c *http.Client, u string, v any) error {
	resp, err := openGet(ctx, c, u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeJSON(resp.Body, v)
}

// drainUntil waits, after a writer stopped, until progress reports that
// the watchers have every event (got >= want), nothing arrived for quiet,
// or limit passed.
func drainUntil(limit, quiet time.Duration, progress func() (got, want int64)) {
	end := time.Now().Add(limit)
	last, lastChange := int64(-1), time.Now()
	for time.Now().Before(end) {
		got, want := progress()
		if got >= want {
			return
		}
		if got != last {
			last, lastChange = got, time.Now()
		} else if time.Since(lastChange) > quiet {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

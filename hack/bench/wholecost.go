package main

// The whole cost (issue 20, item 7). A tier that answers from its cache
// still sends the apiserver requests of its own: the ingestion watch, an
// RV fetch per consistent read, progress probes while a resource is quiet.
// A CPU ratio tier/apiserver that counted only the tier's processes would
// look better the more work the tier moved onto the apiserver, so every
// mode that prints one also prints a "whole" row, with the same rule on
// both sides:
//
//   - reads (LIST, watch-list): the CPU of every process above idle while
//     the reads run. The apiserver serving them itself: its CPU minus its
//     idle rate over the same time. The tier serving them: the tier's
//     processes' CPU plus the apiserver's CPU minus its idle rate — what
//     the reads made the tier ask of it. The idle rate is measured just
//     before, over idleCPU's window, after a settle pause (-settle) so
//     that probes a warm-up read started (they linger 10 s) are not
//     counted as idle.
//   - updates (fanout, nodes): per update written through the apiserver,
//     against a run of the same writer with nothing watching (no tier, no
//     bench watchers): the apiserver's CPU per update then is the write
//     itself. The apiserver serving the watchers: its CPU per update minus
//     that — its dispatch. The tier serving them: the tier's CPU per
//     update plus the apiserver's CPU per update minus that — the tier's
//     ingestion watch, RV fetches and probes, whatever the tier's presence
//     costs the apiserver while it writes. The idle rate cancels out: it is
//     in the writer-alone run too.
//
// The apiserver's CPU is its process's utime+stime (/proc); etcd's is not
// counted on either side (the tier sends etcd nothing of its own).

import (
	"context"
	"fmt"
	"os"
	"time"
)

// aboveIdle is CPU ticks used over elapsed, in ms, minus idle (ms per
// second) over the same time.
func aboveIdle(ticks uint64, idle float64, elapsed time.Duration) float64 {
	return ticksMs(ticks) - idle*elapsed.Seconds()
}

// writeTail is how long a phase's CPU window runs on after its writer
// stopped: the last updates' dispatch.
const writeTail = time.Second

// writerAlone runs the writer with nothing watching and returns what it
// did and the apiserver's CPU per successful write (ms), over the writes
// and writeTail.
func writerAlone(ctx context.Context, apiPID, rate int, d time.Duration, writers int, write func(ctx context.Context, i int) error) (float64, writeResult, error) {
	c0 := cpuTicks(apiPID)
	w := writeLoop(ctx, rate, d, writers, write)
	time.Sleep(writeTail)
	used := ticksMs(cpuTicks(apiPID) - c0)
	if w.writes == 0 {
		return 0, w, fmt.Errorf("writer alone: no write succeeded (%d failed)", w.failed)
	}
	perWrite := used / float64(w.writes)
	fmt.Fprintf(os.Stderr, "bench: writer alone: %d writes in %s (%d ticks dropped, %d failed), apiserver %.3f ms CPU per write\n", w.writes, d, w.dropped, w.failed, perWrite)
	return perWrite, w, nil
}

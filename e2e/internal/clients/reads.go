package clients

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cachetier/cachetier/hack/nodeinstall"
)

// Reads sends consistent reads through the tier until stopped, one at a
// time: a LIST of every configmap, then a GET of one, in turn, with
// client-go's default retries (a 429 or 5xx with Retry-After is tried
// again, up to ten times; a GET also after a reset connection). It counts
// the reads answered, the reads that failed after those retries, and the
// reads whose first attempt failed — what a client without retries would
// have seen.
type Reads struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	res     ReadResults
	current []string // outcome of each attempt of the read in flight
}

// ReadResults is what Reads counted.
type ReadResults struct {
	// OK reads were answered, Failed by error message were not.
	OK     int
	Failed map[string]int
	// FirstAttemptFailed reads needed a retry (whether or not one
	// succeeded), FirstAttempts by what the first attempt got.
	FirstAttemptFailed int
	FirstAttempts      map[string]int
	// Slowest is the longest read, retries included.
	Slowest time.Duration
	// Failures are the failed reads in order (the first 1000).
	Failures []ReadFailure
}

// ReadFailure is one read that failed after client-go's retries.
type ReadFailure struct {
	At  time.Time
	Err string
}

// FailuresBetween are the failures from start to end.
func (r ReadResults) FailuresBetween(start, end time.Time) []ReadFailure {
	var out []ReadFailure
	for _, f := range r.Failures {
		if !f.At.Before(start) && !f.At.After(end) {
			out = append(out, f)
		}
	}
	return out
}

// FailedReads is how many reads failed after retries.
func (r ReadResults) FailedReads() int {
	n := 0
	for _, c := range r.Failed {
		n += c
	}
	return n
}

func (r ReadResults) String() string {
	return fmt.Sprintf("%d answered, %d failed after retries %v, %d first attempts failed %v, slowest %s",
		r.OK, r.FailedReads(), r.Failed, r.FirstAttemptFailed, r.FirstAttempts, r.Slowest.Round(time.Millisecond))
}

// StartReads starts reading through tier (a rest.Config whose server is
// the profile's status.serverURL) the configmaps of namespaces.
func StartReads(tier *rest.Config, namespaces []string) *Reads {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Reads{cancel: cancel, done: make(chan struct{}), res: ReadResults{Failed: map[string]int{}, FirstAttempts: map[string]int{}}}
	cfg := rest.CopyConfig(tier)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return attemptRecorder{next: rt, r: r} })
	kc := kubernetes.NewForConfigOrDie(cfg)
	go func() {
		defer close(r.done)
		for i := 0; ctx.Err() == nil; i++ {
			r.mu.Lock()
			r.current = r.current[:0]
			r.mu.Unlock()
			start := time.Now()
			var err error
			if i%2 == 0 {
				_, err = kc.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			} else {
				ns := namespaces[(i/2)%len(namespaces)]
				_, err = kc.CoreV1().ConfigMaps(ns).Get(ctx, fmt.Sprintf("cm-%03d", (i/2)%nodeinstall.ConfigMapsPerNamespace), metav1.GetOptions{})
			}
			took := time.Since(start)
			if ctx.Err() != nil {
				return // a read cut short by Stop is no result
			}
			r.mu.Lock()
			r.res.Slowest = max(r.res.Slowest, took)
			if err == nil {
				r.res.OK++
			} else {
				r.res.Failed[err.Error()]++
				if len(r.res.Failures) < 1000 {
					r.res.Failures = append(r.res.Failures, ReadFailure{At: time.Now(), Err: err.Error()})
				}
			}
			if len(r.current) > 0 && r.current[0] != "" {
				r.res.FirstAttemptFailed++
				r.res.FirstAttempts[r.current[0]]++
			}
			r.mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return r
}

// Results is what was counted so far.
func (r *Reads) Results() ReadResults {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.res
	out.Failed, out.FirstAttempts = copyCounts(r.res.Failed), copyCounts(r.res.FirstAttempts)
	out.Failures = append([]ReadFailure(nil), r.res.Failures...)
	return out
}

// Stop ends the reads (once; later calls return the same counts).
func (r *Reads) Stop() ReadResults {
	r.cancel()
	<-r.done
	return r.Results()
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// attemptRecorder notes the outcome of every HTTP attempt of the read in
// flight: "" when answered, else the status or the error.
type attemptRecorder struct {
	next http.RoundTripper
	r    *Reads
}

func (a attemptRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := a.next.RoundTrip(req)
	outcome := ""
	switch {
	case err != nil:
		outcome = shorten(err.Error())
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		outcome = resp.Status
	}
	a.r.mu.Lock()
	a.r.current = append(a.r.current, outcome)
	a.r.mu.Unlock()
	return resp, err
}

// shorten keeps an error's last part: its address and port numbers vary,
// what happened does not.
func shorten(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// SortedCounts prints counts by key.
func SortedCounts(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %5d  %s\n", m[k], k)
	}
	return b.String()
}

// Since is what was counted after prev (an earlier Results of the same
// Reads); Slowest is the slowest read overall.
func (r ReadResults) Since(prev ReadResults) ReadResults {
	out := ReadResults{OK: r.OK - prev.OK, FirstAttemptFailed: r.FirstAttemptFailed - prev.FirstAttemptFailed,
		Failed: map[string]int{}, FirstAttempts: map[string]int{}, Slowest: r.Slowest, Failures: r.Failures[len(prev.Failures):]}
	for k, v := range r.Failed {
		if d := v - prev.Failed[k]; d > 0 {
			out.Failed[k] = d
		}
	}
	for k, v := range r.FirstAttempts {
		if d := v - prev.FirstAttempts[k]; d > 0 {
			out.FirstAttempts[k] = d
		}
	}
	return out
}

package apf

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/seatcpu"
)

// Who is rejected. The metrics say which flow schema and priority level
// rejects, not which client: a flood in global-default is one user among
// every authenticated one. The tier logs its 429s, at most one line per
// user and priority level per rejectLogInterval with the count since the
// last line, so the log names a flood's source without being flooded.

// rejectLogInterval is how often one user's rejections at one level are
// logged.
const rejectLogInterval = time.Minute

// classified is what the filter learned of a request: the flow schema
// and level it classified it into (told to the work estimator), and
// whether it let it execute. A request classified and never executed was
// rejected with 429 (queue full, or its wait ended).
type classified struct {
	mu                        sync.Mutex
	flowSchema, priorityLevel string
	executed                  bool
	// lingering is the seat-seconds its estimate holds after it ends
	// (FinalSeats × AdditionalLatency; estimate.go).
	lingering float64
	// work is a LIST's or watch-list's seats' worth of work (the
	// learner's unit, seatcpu.Work) and its kind, counted when it
	// executes.
	work float64
	kind seatcpu.Kind
}

type classifiedKey struct{}

func withClassified(r *http.Request) (*http.Request, *classified) {
	c := &classified{}
	return r.WithContext(context.WithValue(r.Context(), classifiedKey{}, c)), c
}

func classifiedOf(r *http.Request) *classified {
	c, _ := r.Context().Value(classifiedKey{}).(*classified)
	return c
}

// noteClassified records fs and pl on r's classified, if it has one,
// the seat-seconds its estimate holds after it ends and its work.
func noteClassified(r *http.Request, fs, pl string, lingering float64, kind seatcpu.Kind, work float64) {
	if c := classifiedOf(r); c != nil {
		c.mu.Lock()
		c.flowSchema, c.priorityLevel, c.lingering, c.kind, c.work = fs, pl, lingering, kind, work
		c.mu.Unlock()
	}
}

// noteExecuted records that the filter let r's request execute, and
// returns its work and the work's kind.
func noteExecuted(r *http.Request) (kind seatcpu.Kind, work float64) {
	if c := classifiedOf(r); c != nil {
		c.mu.Lock()
		c.executed = true
		kind, work = c.kind, c.work
		c.mu.Unlock()
	}
	return kind, work
}

// lingered is the level and the seat-seconds held after the request
// ended, when it executed ("" when it did not).
func (c *classified) lingered() (pl string, seatSeconds float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.executed {
		return "", 0
	}
	return c.priorityLevel, c.lingering
}

// rejected tells whether the request was classified and not executed,
// and how it was classified.
func (c *classified) rejected() (rejected bool, fs, pl string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.priorityLevel != "" && !c.executed, c.flowSchema, c.priorityLevel
}

type rejectKey struct{ user, priorityLevel string }

type rejectEntry struct {
	logged time.Time
	// since is the rejections since logged, not yet logged.
	since int
}

// rejectLog rate-limits the log lines of rejections.
type rejectLog struct {
	mu      sync.Mutex
	entries map[rejectKey]*rejectEntry
	log     logr.Logger
	now     func() time.Time
}

func newRejectLog(log logr.Logger) *rejectLog {
	return &rejectLog{entries: map[rejectKey]*rejectEntry{}, log: log, now: time.Now}
}

// rejected notes a 429 of r classified as fs/pl; it logs when the user's
// last line at pl is older than rejectLogInterval (with how many were
// rejected in between).
func (l *rejectLog) rejected(r *http.Request, fs, pl string) {
	u, _ := request.UserFrom(r.Context())
	name := ""
	var groups []string
	if u != nil {
		name, groups = u.GetName(), u.GetGroups()
	}
	now := l.now()
	l.mu.Lock()
	k := rejectKey{name, pl}
	e := l.entries[k]
	if e != nil && now.Sub(e.logged) < rejectLogInterval {
		e.since++
		l.mu.Unlock()
		return
	}
	before := 0
	if e != nil {
		before = e.since
	}
	l.entries[k] = &rejectEntry{logged: now}
	// The map holds only the users logged within the last interval (a
	// user rejected again after that gets a line of its own, whatever
	// count was left).
	for k, e := range l.entries {
		if now.Sub(e.logged) >= rejectLogInterval {
			delete(l.entries, k)
		}
	}
	l.mu.Unlock()
	info, _ := request.RequestInfoFrom(r.Context())
	verb, resource := "", ""
	if info != nil {
		verb, resource = info.Verb, info.Resource
	}
	l.log.Info("request rejected by priority and fairness (429)", "user", name, "groups", groups,
		"priorityLevel", pl, "flowSchema", fs, "verb", verb, "resource", resource, "path", r.URL.Path,
		"rejectedSinceLastLine", before, "interval", rejectLogInterval)
}

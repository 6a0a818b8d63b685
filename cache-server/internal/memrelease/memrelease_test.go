package memrelease

import (
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// Loads finishing within Delay of the first one share one release; a load
// after it fired starts another.
func TestReleaserCoalescesBursts(t *testing.T) {
	released := make(chan struct{}, 10)
	r := New(50*time.Millisecond, logr.Discard(), nil)
	r.release = func() { released <- struct{}{} }
	for range 5 {
		r.Loaded(100)
	}
	<-released
	r.mu.Lock()
	pending, objects := r.pending, r.objects
	r.mu.Unlock()
	if pending || objects != 0 {
		t.Fatalf("after a release: pending %v, objects %d", pending, objects)
	}
	select {
	case <-released:
		t.Fatal("five loads in one burst released twice")
	case <-time.After(200 * time.Millisecond):
	}
	r.Loaded(1)
	<-released
}

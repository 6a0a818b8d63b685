package watch

import (
	"sort"
	"sync/atomic"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// index decides which watchers an event is offered to (the cacher's
// indexedWatchers and startDispatching): a watcher whose selector pins an
// indexed field to a value reads only the events whose old or new object
// has that value — a posting list per value, kept for every value whether
// watched or not, so that a watch can resume from an RV in it — and every
// other watcher reads the whole history. The hub's lock guards it.
type index struct {
	fields []fieldIndex
	// unindexed read every event.
	unindexed watcherSet
	// indexedWatchers and watchedValues are what the gauges export.
	indexedWatchers, watchedValues int
	// gen numbers publish batches; touched are the postings the current
	// batch added to or dropped from, each once (posting.mark).
	gen     uint64
	touched []*posting
}

type fieldIndex struct {
	field  string
	values map[string]*posting
}

// posting is one value of one indexed field: the sequence numbers of the
// history events whose old or new object has the value, in order, and the
// watchers that asked for it. An entry is numbered by its position since
// the posting was created (dropped counts the entries pruned from the
// front), so a watcher's cursor stays valid while the front is pruned; a
// posting lives while it has entries or watchers.
type posting struct {
	seqs     []uint64
	dropped  uint64
	watchers watcherSet
	// wake is closed when entries are added (indexed watchers wait on it).
	wake wakeup
	mark uint64
}

func (p *posting) first() uint64           { return p.dropped }
func (p *posting) head() uint64            { return p.dropped + uint64(len(p.seqs)) }
func (p *posting) seq(entry uint64) uint64 { return p.seqs[entry-p.dropped] }
func (p *posting) unused() bool            { return len(p.seqs) == 0 && len(p.watchers) == 0 }

// entryAt is the first entry whose history event is at or after seq.
func (p *posting) entryAt(seq uint64) uint64 {
	return p.dropped + uint64(sort.Search(len(p.seqs), func(i int) bool { return p.seqs[i] >= seq }))
}

func newIndex(fields []string) index { return index{fields: newFieldIndexes(fields)} }

// beginBatch starts a publish: touched is emptied.
func (x *index) beginBatch() {
	x.gen++
	clear(x.touched)
	x.touched = x.touched[:0]
}

func newFieldIndexes(fields []string) []fieldIndex {
	out := make([]fieldIndex, 0, len(fields))
	for _, f := range fields {
		out = append(out, fieldIndex{field: f, values: map[string]*posting{}})
	}
	return out
}

func (x *index) markTouched(p *posting) {
	if p.mark != x.gen {
		p.mark = x.gen
		x.touched = append(x.touched, p)
	}
}

// values calls fn with each distinct value of field among the event's old
// and new object: the values whose watchers may see it. An object without
// the field has the value "", as for a field selector.
func values(e *Event, field string, fn func(string)) {
	v := e.Object.FieldSet().Get(field)
	fn(v)
	if e.Prev != nil {
		if old := e.Prev.FieldSet().Get(field); old != v {
			fn(old)
		}
	}
}

// add files the history event seq under its values and returns how many
// watchers it is offered to.
func (x *index) add(seq uint64, e *Event) int {
	n := len(x.unindexed)
	for i := range x.fields {
		fi := &x.fields[i]
		values(e, fi.field, func(v string) {
			p := fi.values[v]
			if p == nil {
				p = &posting{}
				fi.values[v] = p
			}
			p.seqs = append(p.seqs, seq)
			x.markTouched(p)
			n += len(p.watchers)
		})
	}
	return n
}

// drop removes the pruned history event seq from its postings, and the
// postings nobody needs any more.
func (x *index) drop(seq uint64, e *Event) {
	for i := range x.fields {
		fi := &x.fields[i]
		values(e, fi.field, func(v string) {
			p := fi.values[v]
			if p == nil {
				return
			}
			// Entries are in history order, so the pruned event is at
			// the front (the loop also drops anything older).
			k := 0
			for k < len(p.seqs) && p.seqs[k] <= seq {
				k++
			}
			clear(p.seqs[:k])
			p.seqs = p.seqs[k:]
			p.dropped += uint64(k)
			x.markTouched(p)
			if p.unused() {
				delete(fi.values, v)
			}
		})
	}
}

// lookup is the posting a request's Index reads, created if needed; nil
// when the hub does not index that field (the watcher is then unindexed:
// correct, only slower).
func (x *index) lookup(iv store.IndexValue) *posting {
	if iv.Field == "" {
		return nil
	}
	for i := range x.fields {
		if fi := &x.fields[i]; fi.field == iv.Field {
			p := fi.values[iv.Value]
			if p == nil {
				p = &posting{}
				fi.values[iv.Value] = p
			}
			return p
		}
	}
	return nil
}

// register adds w to the watchers of its posting (w.post) or to the
// unindexed ones.
func (x *index) register(w *Watcher) {
	if w.post == nil {
		x.unindexed.add(w)
		return
	}
	if len(w.post.watchers) == 0 {
		x.watchedValues++
	}
	x.indexedWatchers++
	w.post.watchers.add(w)
}

func (x *index) unregister(w *Watcher) {
	if w.post == nil {
		x.unindexed.remove(w)
		return
	}
	w.post.watchers.remove(w)
	x.indexedWatchers--
	if len(w.post.watchers) == 0 {
		x.watchedValues--
		if len(w.post.seqs) == 0 {
			x.forget(w.post, w.req.Index)
		}
	}
}

func (x *index) forget(p *posting, iv store.IndexValue) {
	for i := range x.fields {
		if fi := &x.fields[i]; fi.field == iv.Field && fi.values[iv.Value] == p {
			delete(fi.values, iv.Value)
		}
	}
}

// wakeTouched wakes the watchers of the postings the batch added to.
func (x *index) wakeTouched() {
	for _, p := range x.touched {
		p.wake.signal()
	}
}

// eachWatched calls fn for every posting that has watchers (Reset, Close,
// a relist's bookmark: rare, and O(values) is then fine).
func (x *index) eachWatched(fn func(*posting)) {
	for i := range x.fields {
		for _, p := range x.fields[i].values {
			if len(p.watchers) > 0 {
				fn(p)
			}
		}
	}
}

// reset forgets every entry: the history was reset. Watchers must have
// been unregistered.
func (x *index) reset() {
	x.fields = newFieldIndexes(fieldNames(x.fields))
}

func fieldNames(fs []fieldIndex) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.field
	}
	return out
}

// watcherSet is a set of watchers that is cheap to walk (a slice); each
// watcher is in one set at a time and knows its slot there.
type watcherSet []*Watcher

func (s *watcherSet) add(w *Watcher) {
	w.slot = len(*s)
	*s = append(*s, w)
}

func (s *watcherSet) remove(w *Watcher) {
	last := len(*s) - 1
	moved := (*s)[last]
	(*s)[w.slot] = moved
	moved.slot = w.slot
	(*s)[last] = nil
	*s = (*s)[:last]
}

// wakeup is a broadcast to whoever waits for the next change that costs
// nothing while nobody waits: a waiter takes the channel (creating it)
// under the hub's read lock, a signal under the write lock closes it.
// Replacing one channel on every change would allocate per event per
// value even for values nobody watches.
type wakeup struct{ ch atomic.Pointer[chan struct{}] }

func (w *wakeup) wait() <-chan struct{} {
	if c := w.ch.Load(); c != nil {
		return *c
	}
	c := make(chan struct{})
	if w.ch.CompareAndSwap(nil, &c) {
		return c
	}
	return *w.ch.Load()
}

func (w *wakeup) signal() {
	if c := w.ch.Swap(nil); c != nil {
		close(*c)
	}
}

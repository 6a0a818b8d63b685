package encoding

import (
	"container/list"
	"runtime"
	"sync"
	"weak"

	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// entryOverhead approximates an entry's bookkeeping (map slot, list
// element, key, slice header) so that many tiny entries still count.
const entryOverhead = 128

type cacheKey struct {
	obj     weak.Pointer[store.Object]
	variant uint8
}

type cacheEntry struct {
	key   cacheKey
	value []byte
}

// lru is a byte-bounded least-recently-used cache keyed by weak pointers to
// stored objects. It never keeps an object alive: once the store (and every
// snapshot) has dropped an object, the garbage collector reclaims it and a
// cleanup removes its entries.
type lru struct {
	max int64

	mu    sync.Mutex
	size  int64
	order list.List // front = most recently used; values are *cacheEntry
	items map[cacheKey]*list.Element
}

func newLRU(maxBytes int64) *lru {
	return &lru{max: maxBytes, items: map[cacheKey]*list.Element{}}
}

func cost(b []byte) int64 { return int64(len(b)) + entryOverhead }

func (c *lru) get(o *store.Object, variant uint8) ([]byte, bool) {
	if c.max <= 0 {
		return nil, false
	}
	k := cacheKey{weak.Make(o), variant}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[k]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*cacheEntry).value, true
}

func (c *lru) put(o *store.Object, variant uint8, value []byte) {
	if c.max <= 0 || cost(value) > c.max {
		return
	}
	k := cacheKey{weak.Make(o), variant}
	c.mu.Lock()
	if _, ok := c.items[k]; ok {
		c.mu.Unlock()
		return // a concurrent conversion got there first
	}
	c.items[k] = c.order.PushFront(&cacheEntry{key: k, value: value})
	c.size += cost(value)
	for c.size > c.max {
		last := c.order.Back()
		c.removeLocked(last.Value.(*cacheEntry).key)
	}
	c.mu.Unlock()
	// Drop the entry when the object dies. If it was evicted (or evicted
	// and cached again) before that, removing by key is still right: the
	// key names a dead object either way.
	runtime.AddCleanup(o, func(k cacheKey) { c.remove(k) }, k)
}

func (c *lru) remove(k cacheKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(k)
}

func (c *lru) removeLocked(k cacheKey) {
	el, ok := c.items[k]
	if !ok {
		return
	}
	c.order.Remove(el)
	delete(c.items, k)
	c.size -= cost(el.Value.(*cacheEntry).value)
}

func (c *lru) stats() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items), c.size
}

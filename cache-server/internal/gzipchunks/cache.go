// Package gzipchunks writes gzip-compressed JSON list bodies (and the
// initial events of watch-lists) from deflate segments kept between
// requests, so a LIST of objects that did not change since an earlier LIST
// is not compressed again.
//
// Compressing is most of what a large LIST costs the tier: the stored
// bytes are written as they are, but kube-apiserver gzips every LIST body
// over 128 KiB for clients that accept it (client-go, kubectl, informers
// all do), and so must the tier (package front, compress.go). Yet the
// objects of a large resource mostly did not change between two LISTs of
// it — informers relisting, a controller restarting, kubectl get run
// again — and the apiserver's own watch cache keeps the serialization of an
// object for the same reason (cachingObject, per watch event).
//
// A list's items are cut into chunks at content-defined points (an item
// whose Seq hashes to a boundary, or a byte bound), so chunks repeat across
// LISTs of different ranges (a namespace, the whole resource, pages) and a
// changed object only changes its own chunk. Each chunk is compressed as a
// self-contained run of deflate blocks: the compressor is reset before it
// (no back-reference into bytes another response may not have) and
// sync-flushed after it (it ends on a byte boundary). Any sequence of such
// runs is a valid deflate stream, so a body is the gzip header, fresh runs
// (the list's head, the commas between chunks, its tail) and cached runs,
// the final block, and a trailer whose CRC-32 is combined from the parts'
// (crc.go) instead of being computed over bytes that are not read.
//
// A chunk is identified by its objects' Seqs (store.Object.Seq: one state
// of one object in its Store), compared in full on every use, so a cached
// run is used only for exactly the objects it was made from. A server
// without Store Seqs for its items (a fleet's front) hands them over one at
// a time and they are known by a hash of their bytes (stream.go). The cache is
// bounded in bytes for all resources of a server, least recently used
// first out; a body written from it decompresses to exactly the bytes an
// uncached one does (the tests compare them).
package gzipchunks

import (
	"bufio"
	"container/list"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultCacheBytes bounds the cache when no size is configured: the
// compressed runs of ~300-600 MiB of typical JSON objects.
const DefaultCacheBytes = 64 << 20

// Metrics are the cache's series (package metrics creates them).
type Metrics struct {
	Chunks    *prometheus.CounterVec // resource, result: hit, miss
	Bytes     prometheus.Gauge
	Evictions prometheus.Counter
}

// Cache keeps compressed chunks for the resources of one server.
type Cache struct {
	max     int64
	x2n     *x2nTable
	metrics Metrics
	// deflaters pools level-1 compressors (kube-apiserver's gzip level).
	deflaters sync.Pool
	// buffers pools the write buffers items go through to the compressor
	// (few large writes instead of three per item).
	buffers sync.Pool
	// streams pools Streams and their chunk buffers (stream.go).
	streams sync.Pool

	mu      sync.Mutex
	used    int64
	lru     list.List // *entry, most recently used first
	entries map[entryKey]*list.Element
}

// New returns a cache of at most maxBytes of compressed chunks (0:
// DefaultCacheBytes).
func New(maxBytes int64, m Metrics) *Cache {
	if maxBytes == 0 {
		maxBytes = DefaultCacheBytes
	}
	c := &Cache{max: maxBytes, x2n: newX2nTable(), metrics: m, entries: map[entryKey]*list.Element{}}
	c.deflaters.New = func() any {
		fw, _ := flate.NewWriter(nil, flate.BestSpeed) // a valid level: no error
		return fw
	}
	c.buffers.New = func() any { return bufio.NewWriterSize(nil, 64<<10) }
	c.streams.New = func() any { return &Stream{buf: make([]byte, 0, maxChunkBytes+16<<10)} }
	return c
}

// Scope is one resource's part of the cache, for one form of body. Seqs
// are unique within one Store only, so a Scope must serve the objects of
// one Store (Items), or only objects known by their content (Stream).
type Scope struct {
	c            *Cache
	hits, misses prometheus.Counter
	// sep is written between two items (and so between two chunks): a
	// list's comma, nothing between a watch stream's event frames (each
	// ends in its own newline).
	sep []byte
}

// Scope returns a new scope for JSON list bodies (items joined by commas)
// whose chunks are counted under resource.
func (c *Cache) Scope(resource string) *Scope {
	return c.scope(resource, []byte{','})
}

// StreamScope returns a new scope for streams of self-delimiting items (a
// watch-list's initial ADDED events, one JSON frame per line), counted
// under resource with the resource's list chunks. Its chunks are its own:
// the same objects framed as events are other bytes than as list items.
func (c *Cache) StreamScope(resource string) *Scope {
	return c.scope(resource, nil)
}

func (c *Cache) scope(resource string, sep []byte) *Scope {
	return &Scope{
		c:      c,
		hits:   c.metrics.Chunks.WithLabelValues(resource, "hit"),
		misses: c.metrics.Chunks.WithLabelValues(resource, "miss"),
		sep:    sep,
	}
}

// entryKey finds a chunk's candidate entry: its scope, first and last
// objects and length. The Seqs are compared in full before the entry is
// used. With the last Seq in the key, the same range read at two
// snapshots (a client paging through an older state while objects
// change) keeps two entries instead of each evicting the other.
type entryKey struct {
	scope       *Scope
	first, last uint64
	n           int
}

// entry is one compressed chunk. It is immutable once in the cache;
// readers use it after releasing the lock.
type entry struct {
	key  entryKey
	seqs []uint64
	// run is the chunk's deflate blocks, from a reset compressor to a
	// sync flush.
	run []byte
	// size and crc are of the chunk's uncompressed bytes; op appends
	// them in crcCombine.
	size int64
	crc  uint32
	op   uint32
}

// entryOverhead approximates the bookkeeping of one entry (the entry, its
// list element and map slot) for the budget.
const entryOverhead = 160

func (e *entry) cost() int64 { return int64(len(e.run)) + 8*int64(len(e.seqs)) + entryOverhead }

// lookup returns the entry for exactly these Seqs, or nil. An entry under
// the same key with other Seqs is stale (its objects changed) and is
// dropped.
func (c *Cache) lookup(k entryKey, seqs func(i int) uint64) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil
	}
	e := el.Value.(*entry)
	for i, s := range e.seqs {
		if seqs(i) != s {
			c.removeLocked(el)
			return nil
		}
	}
	c.lru.MoveToFront(el)
	return e
}

// add keeps e, replacing an entry under the same key and evicting the
// least recently used beyond the budget. An entry larger than an eighth of
// the budget is not kept: it would push out many others to be used once.
func (c *Cache) add(e *entry) {
	cost := e.cost()
	if cost > c.max/8 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[e.key]; ok {
		c.removeLocked(el)
	}
	c.entries[e.key] = c.lru.PushFront(e)
	c.used += cost
	for c.used > c.max {
		c.removeLocked(c.lru.Back())
		c.metrics.Evictions.Inc()
	}
	c.metrics.Bytes.Set(float64(c.used))
}

func (c *Cache) removeLocked(el *list.Element) {
	e := c.lru.Remove(el).(*entry)
	delete(c.entries, e.key)
	c.used -= e.cost()
	c.metrics.Bytes.Set(float64(c.used))
}

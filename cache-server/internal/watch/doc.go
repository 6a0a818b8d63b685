// Package watch fans one resource's ingested change stream out to many
// watchers, the way kube-apiserver's cacher does (k8s.io/apiserver
// pkg/storage/cacher), with one structural difference: events are not
// copied into a channel per watcher. The hub keeps one shared, bounded
// history of recent events (pointers to the immutable stored objects) and
// every watcher is only a cursor into what can reach it.
//
// One job per file, as the cacher keeps them apart:
//   - history.go: the event history (watch_cache_history.go): append,
//     prune by window and count, the search a resuming watch starts from,
//     the gaps a relist leaves;
//   - index.go: which watchers an event reaches (cacher.go's
//     indexedWatchers, startDispatching, triggerValues);
//   - watcher.go: one watch (cache_watcher.go): its cursor, the selector's
//     view of each event (ADDED/MODIFIED/DELETED), bookmarks, lag;
//   - hub.go: ties them together under one lock (publish, register,
//     terminate, Reset, Close); follow.go: a fleet shard's unfiltered view.
//
// # A shared history instead of per-watcher buffers
//
//   - A watcher's "buffer" is the distance between its cursor and the head
//     of what reaches it. It is bounded (Options.BufferSize): a watcher that
//     falls further behind is terminated and counted, as the cacher closes
//     a watcher whose channel is full. Memory per watcher is O(1) whatever
//     the buffer size, and no watcher can slow another or ingestion.
//   - Resuming a watch from resourceVersion X is a binary search in the
//     same history (the cacher's watchCache history plays this role);
//     deriving events from store snapshots would need a tree diff per
//     resumption and would lose the per-event previous state that selector
//     transitions need.
//   - Watch-list reads its initial state from a store snapshot at the RV
//     the cursor starts from, so the snapshot and the live events join
//     without a gap or a duplicate, and initial streaming holds no lock: a
//     slow watch-list client delays nobody.
//
// # Dispatch by index
//
// A kubelet watches its node's pods (fieldSelector=spec.nodeName=<node>);
// with one shared cursor per watcher every event would wake every watcher
// and have each evaluate its selector: O(all watchers) per event, 500
// kubelets doing 500 selector checks for one pod update. The cacher keeps
// watchers whose selector pins an indexed field's value in
// valueWatchers[value] and offers an event only to the watchers of its old
// and new values plus the unindexed ones. The hub does the same on top of
// the shared history: per indexed field (Options.FieldIndexes), per value,
// a posting list — the sequence numbers of the history events whose old or
// new object has the value, appended at publish time for every value
// (watched or not, O(1) per event per field), pruned with the history —
// with the value's watchers and a wake-up of its own. An indexed watcher
// (Request.Index) is a cursor into its value's posting list: an event of
// another value neither wakes it nor costs it a selector check, its lag
// counts only its value's events (a storm on other nodes never terminates
// it; falling behind on its own events does), and resuming from an RV is a
// binary search in its postings. Publishing costs O(1 + watchers reached):
// appending to at most two postings per indexed field, waking those two
// values' watchers and the unindexed ones, and checking the lag of exactly
// those (the publisher used to compare every watcher's cursor).
//
// Why posting lists over the cacher's per-watcher channels: a per-watcher
// queue would cost the same per event, but memory per watcher grows with
// its buffer, and a watch resuming from an RV would filter the whole
// history to fill its queue; postings are shared by all watchers of a
// value, cost one integer per event per value (at most 2 per indexed field
// per event, bounded by the history), and keep resumption a search. Why
// postings for every value rather than only watched ones: a watch may
// resume from an RV before its value had any watcher, and the postings
// are as cheap to keep as the history itself.
//
// Correctness does not depend on the index: an indexed watcher still
// applies its whole selector to each event's old and new object (so the
// transitions into and out of its value are the ADDED and DELETED they are
// today); the index only skips events neither of whose objects can match.
// A bookmark stays a true watermark: an indexed watcher that has read its
// postings up to their end has considered every event up to the hub's RV.
package watch

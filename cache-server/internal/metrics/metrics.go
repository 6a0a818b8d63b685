// Package metrics defines the cache-server's Prometheus metrics. They live
// in a struct registered on a caller-supplied registry (no package-level
// collectors) so tests and multiple servers in one process stay isolated.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is every metric the cache-server exports, prefixed cachetier_.
type Metrics struct {
	Requests                   *prometheus.CounterVec   // verb, resource, code
	RequestDuration            *prometheus.HistogramVec // verb, resource
	FreshnessWait              *prometheus.HistogramVec // resource, outcome
	RVFetches                  *prometheus.CounterVec   // resource, outcome
	ProgressProbes             *prometheus.CounterVec   // resource, outcome
	ProgressProbeBookmark      *prometheus.HistogramVec // resource: probe opened to its bookmark
	UpstreamEvents             *prometheus.CounterVec   // resource, type
	UpstreamRelists            *prometheus.CounterVec   // resource, reason
	UpstreamWatchListFallbacks *prometheus.CounterVec   // resource
	UpstreamRV                 *prometheus.GaugeVec     // resource: last RV applied from upstream
	UpstreamLatestRV           *prometheus.GaugeVec     // resource: latest RV the apiserver reported
	ShardObjects               *prometheus.GaugeVec     // resource, shard
	ShardBytes                 *prometheus.GaugeVec     // resource, shard
	ShardAppliedRV             *prometheus.GaugeVec     // resource, shard

	// Field indexes (package store, index.go) and the LISTs read through
	// them.
	IndexEntries *prometheus.GaugeVec   // resource, index
	IndexValues  *prometheus.GaugeVec   // resource, index
	IndexBytes   *prometheus.GaugeVec   // resource, index
	IndexedLists *prometheus.CounterVec // resource, index

	WatchersActive     *prometheus.GaugeVec     // resource
	WatchEvents        *prometheus.CounterVec   // resource, type: events sent to watchers
	WatchersTerminated *prometheus.CounterVec   // resource, reason: watchers closed by the tier
	WatchListInitial   *prometheus.HistogramVec // resource: request start to initial-events-end bookmark
	WatchBufferFill    *prometheus.HistogramVec // resource: watcher lag / buffer size when it reads
	WatchDelivery      *prometheus.HistogramVec // resource: event received from upstream to written to a watcher
	// How the hub dispatches events (package watch's index).
	WatchDispatchWatchers   *prometheus.GaugeVec     // resource, type: indexed, unindexed
	WatchIndexValues        *prometheus.GaugeVec     // resource: distinct indexed values watched
	WatchDispatchCandidates *prometheus.HistogramVec // resource: watchers an event was offered to

	// A fleet's shards (serving fronts) and fronts (calling shards).
	ShardRequests        *prometheus.CounterVec   // verb, resource, outcome
	ShardRequestDuration *prometheus.HistogramVec // verb, resource
	FleetShardCalls      *prometheus.CounterVec   // shard, verb, outcome
	FleetStreamRestarts  *prometheus.CounterVec   // resource, shard, reason
	FleetWatermark       *prometheus.GaugeVec     // resource, shard
	FleetShardSeatCPU    *prometheus.GaugeVec     // resource
	// FleetLatestReadsRefreshed: reads of the latest state served at the
	// apiserver's current RV because a shard no longer held the merged
	// watermark (fleet.Source.latestRV).
	FleetLatestReadsRefreshed *prometheus.CounterVec // resource

	ProtobufConversions *prometheus.CounterVec // path: cached, plan, typed
	TableErrors         *prometheus.CounterVec // resource: Tables (kubectl get) that could not be built

	// Compressed LIST chunks kept between requests (package gzipchunks).
	ListGzipChunks    *prometheus.CounterVec // resource, result: hit, miss
	ListGzipBytes     prometheus.Gauge
	ListGzipEvictions prometheus.Counter

	OpenAPIRefreshes   *prometheus.CounterVec // result: unchanged, updated, error
	OpenAPILastSuccess prometheus.Gauge       // Unix time of the last successful OpenAPI poll

	AuthnConnCache *prometheus.CounterVec // result: hit, miss, bypass
	AuthLastKnown  *prometheus.CounterVec // review, result: reused, none
	// AuthzRenewals: result: renewed, failed (package auth, renewal.go).
	AuthzRenewals *prometheus.CounterVec
	Impersonation *prometheus.CounterVec // result: allowed, forbidden, invalid, error
	// SelectorAuthorizations: result: broad, narrow, node (package auth,
	// selectors.go).
	SelectorAuthorizations *prometheus.CounterVec
	Goaways                prometheus.Counter // HTTP/2 connections asked to reconnect (serving.withGoaway)
	MemoryReleased         prometheus.Counter // bytes returned to the OS after bulk loads

	// What alerts need about the process itself.
	UpstreamResponses *prometheus.CounterVec // code: responses of the apiserver to the tier's calls
	ServingCertExpiry prometheus.Gauge       // NotAfter of the certificate being served, Unix seconds
	MemoryLimit       *prometheus.GaugeVec   // no labels; only set when the process has a cgroup memory limit
	// APFConfigSynced: no labels; set (0, then 1) where priority and
	// fairness runs (standalone, fronts; package apf).
	APFConfigSynced *prometheus.GaugeVec
	// APFLingering: priority_level; seat-seconds requests held after
	// they ended (package apf, estimate.go).
	APFLingering *prometheus.CounterVec
	// SeatCPU: kind (list, watch-list); the CPU a seat's worth of read
	// work takes (package seatcpu), in every role.
	SeatCPU *prometheus.GaugeVec
	// BulkRequests: outcome (lowered, failed, unlowered); requests whose
	// bulk work ran on a thread of lower priority (package bulkthread).
	BulkRequests *prometheus.CounterVec
	// RequestDeadlineExceeded: verb; requests still running at the
	// request deadline (package deadline), cut there.
	RequestDeadlineExceeded *prometheus.CounterVec
}

// resultCounter is a counter by "result" whose results' series exist, at
// 0, from the start: a dashboard panel of a result that has not happened
// shows zeros rather than no data (e2e/observability requires every panel
// query to return series).
func resultCounter(name, help string, results ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"result"})
	for _, r := range results {
		c.WithLabelValues(r)
	}
	return c
}

// New creates the metrics and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_requests_total",
			Help: "Requests served by the tier, by verb, resource and HTTP status code.",
		}, []string{"verb", "resource", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_request_duration_seconds",
			Help:    "Latency of requests served by the tier, including freshness waits.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"verb", "resource"}),
		FreshnessWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_freshness_wait_seconds",
			Help:    "Time a read waited for the cache to reach the resourceVersion it needs (consistent reads and RV=X).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2, 3, 5, 10},
		}, []string{"resource", "outcome"}),
		RVFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_upstream_rv_fetches_total",
			Help: "Fetches of the apiserver's current resourceVersion for consistent reads (coalesced across readers).",
		}, []string{"resource", "outcome"}),
		ProgressProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_upstream_progress_probes_total",
			Help: "Short upstream watches opened to prove progress on a resource whose stream was quiet, by outcome (bookmark, nothing_due, late, bookmarkless, error; relist: a re-read of a resource without bookmarks).",
		}, []string{"resource", "outcome"}),
		ProgressProbeBookmark: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_upstream_progress_probe_bookmark_seconds",
			Help:    "Time from opening a progress probe to its bookmark (the apiserver sends bookmarks on a 1-1.25 s timer).",
			Buckets: []float64{.05, .1, .25, .5, .75, 1, 1.25, 1.5, 2, 2.5, 3},
		}, []string{"resource"}),
		UpstreamEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_upstream_events_total",
			Help: "Events received from the apiserver's watch streams.",
		}, []string{"resource", "type"}),
		UpstreamRelists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_upstream_relists_total",
			Help: "Full re-reads of a resource from the apiserver (start-up, 410 Gone, errors).",
		}, []string{"resource", "reason"}),
		UpstreamWatchListFallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_upstream_watchlist_fallbacks_total",
			Help: "Loads that fell back to LIST+WATCH because the apiserver refused watch-list.",
		}, []string{"resource"}),
		UpstreamRV: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_upstream_applied_resource_version",
			Help: "The resourceVersion up to which the cache has applied the apiserver's stream.",
		}, []string{"resource"}),
		UpstreamLatestRV: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_upstream_latest_resource_version",
			Help: "The latest resourceVersion the apiserver reported (RV fetches and bookmarks); the difference to the applied RV is the lag.",
		}, []string{"resource"}),
		ShardObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_shard_objects",
			Help: "Objects held per hash shard.",
		}, []string{"resource", "shard"}),
		ShardBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_shard_bytes",
			Help: "Encoded bytes held per hash shard.",
		}, []string{"resource", "shard"}),
		ShardAppliedRV: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_shard_applied_resource_version",
			Help: "The resourceVersion each hash shard has applied.",
		}, []string{"resource", "shard"}),
		WatchersActive: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_watchers",
			Help: "Active watches served by the tier.",
		}, []string{"resource"}),
		WatchEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_watch_events_total",
			Help: "Watch events written to clients, by type (including initial events and bookmarks).",
		}, []string{"resource", "type"}),
		WatchersTerminated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachetier_watchers_terminated_total",
			Help: "Watches closed by the tier because the client could not keep up (reason slow).",
		}, []string{"resource", "reason"}),
		WatchListInitial: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_watch_list_initial_events_seconds",
			Help:    "Time from a watch-list request's arrival to its initial-events-end bookmark.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"resource"}),
		WatchBufferFill: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_watch_buffer_fill_ratio",
			Help:    "How full a watcher's buffer was (events behind the head / buffer size) when it read events.",
			Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1},
		}, []string{"resource"}),
		WatchDelivery: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_watch_delivery_seconds",
			Help:    "Time from receiving an event from the apiserver to writing it to a watcher.",
			Buckets: []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"resource"}),
		WatchDispatchWatchers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_watch_dispatch_watchers",
			Help: "Active watchers by how events reach them: indexed (their field selector requires a value of an indexed field, such as spec.nodeName=<node>; only events whose old or new object has that value are offered to them) or unindexed (every event of the resource is).",
		}, []string{"resource", "type"}),
		WatchIndexValues: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachetier_watch_index_values",
			Help: "Distinct values of indexed fields that at least one indexed watcher requires; indexed watchers divided by it is the watchers per value.",
		}, []string{"resource"}),
		WatchDispatchCandidates: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachetier_watch_dispatch_candidates",
			Help:    "Watchers each published event was offered to: the indexed watchers of its old and new values plus every unindexed watcher (the work of dispatching it).",
			Buckets: []float64{0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000},
		}, []string{"resource"}),
	}
	m.ProtobufConversions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_protobuf_messages_total",
		Help: "Protobuf messages of objects served, by path: cached (converted earlier), plan (converted from the JSON by a per-type plan), typed (through the Go type: the plan refused the type or the JSON).",
	}, []string{"path"})
	m.AuthnConnCache = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_authn_connection_cache_total",
		Help: "Authentications answered from the connection's cache (hit), by the delegated authenticators (miss), or not eligible for the cache (bypass: no client certificate, no cache on the server).",
	}, []string{"result"})
	m.AuthLastKnown = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_auth_last_known_answers_total",
		Help: "Reviews (tokenreview, subjectaccessreview) the apiserver could not answer, by result: reused (the last answer for the same token or request attributes, at most 5m old, was used instead) or none (there was none: the request failed).",
	}, []string{"review", "result"})
	// Zeros from the start, as Impersonation below: the apiserver is
	// reachable nearly always, and the dashboard's panel would otherwise
	// show no data (e2e/observability requires every panel query to
	// return series).
	for _, review := range []string{"tokenreview", "subjectaccessreview"} {
		for _, result := range []string{"reused", "none"} {
			m.AuthLastKnown.WithLabelValues(review, result)
		}
	}
	m.AuthzRenewals = resultCounter("cachetier_authorization_renewals_total",
		"Authorization answers in use renewed before they expired (a SubjectAccessReview sent in the background in the last quarter of the cache TTL, so that no request waits for one), by result: renewed, failed (the answer expires unrenewed; the next request asks itself).",
		"renewed", "failed")
	m.SelectorAuthorizations = resultCounter("cachetier_authorization_selector_requests_total",
		"Authorizations of LISTs and WATCHes with field or label selectors, by how they were decided: broad (allowed without the selectors: one SubjectAccessReview answers every selector of the same user, verb and resource), narrow (not allowed without them: asked again with them), node (a kubelet's, group system:nodes: asked with them at once).",
		"broad", "narrow", "node")
	// A cluster where nobody impersonates shows zeros, not no data.
	m.Impersonation = resultCounter("cachetier_impersonation_requests_total",
		"Requests to the tier's endpoint with Impersonate-* headers, by result: allowed (answered as the impersonated user), forbidden (the caller may not impersonate them), invalid (headers the apiserver rejects), error.",
		"allowed", "forbidden", "invalid", "error")
	m.Goaways = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cachetier_http2_goaways_total",
		Help: "HTTP/2 responses that asked the client to move to a new connection (--goaway-chance), so the aggregator's single connection to a fleet's Service is spread over its fronts.",
	})
	m.MemoryReleased = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cachetier_memory_released_bytes_total",
		Help: "Heap memory returned to the operating system right after initial loads (package memrelease).",
	})
	m.ShardRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_shard_requests_total",
		Help: "Requests a fleet shard served to its fronts, by verb (list, watch, currentrv, wait), resource and outcome (ok; error; misdirected: the front asked for hash shards this replica does not hold, while the shard count changes).",
	}, []string{"verb", "resource", "outcome"})
	m.ShardRequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cachetier_shard_request_duration_seconds",
		Help:    "Duration of requests a fleet shard served to its fronts (watch: the stream's lifetime).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 60, 600},
	}, []string{"verb", "resource"})
	m.FleetShardCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_fleet_shard_calls_total",
		Help: "Calls a fleet front made to its shards, by shard, verb and outcome (ok; error: a replica refused; unreachable: no replica reachable; initializing: every reachable replica still loading; misdirected: no replica holds the hash shards the front's topology gives the shard, while the shard count changes).",
	}, []string{"shard", "verb", "outcome"})
	m.FleetStreamRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_fleet_stream_restarts_total",
		Help: "A front's change streams from its shards that ended and were reopened, by reason (error; expired: the shard no longer had the history, so the front's watchers were closed).",
	}, []string{"resource", "shard", "reason"})
	m.FleetWatermark = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_fleet_shard_watermark",
		Help: "The resourceVersion up to which a front has every change of a shard; the front serves the minimum over shards.",
	}, []string{"resource", "shard"})
	m.FleetShardSeatCPU = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_fleet_shard_seat_cpu_seconds",
		Help: "On a front, the CPU time the shards take for a seat's worth of a read's work (the mean of what they report, their cachetier_seat_cpu_seconds), which the front charges its LISTs beside its own.",
	}, []string{"resource"})
	m.FleetLatestReadsRefreshed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_fleet_latest_reads_refreshed_total",
		Help: "Reads of the latest state (resourceVersion=0 LISTs, GETs) a front served at the apiserver's current resourceVersion, waiting as a consistent read, because a shard no longer held the front's merged watermark (every replica of it restarted since).",
	}, []string{"resource"})
	m.UpstreamResponses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_upstream_responses_total",
		Help: "Responses of the apiserver to every call the tier makes (ingestion, resourceVersion fetches, TokenReview, SubjectAccessReview), by HTTP status code; code \"error\" when no response arrived.",
	}, []string{"code"})
	m.ServingCertExpiry = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cachetier_serving_certificate_expiry_timestamp_seconds",
		Help: "When the serving certificate the process currently presents expires (its NotAfter), in Unix seconds; rotated files are picked up without a restart.",
	})
	m.MemoryLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_memory_limit_bytes",
		Help: "The memory limit of the process' cgroup (the container's limit); absent when there is none.",
	}, nil)
	m.OpenAPIRefreshes = resultCounter("cachetier_openapi_refreshes_total",
		"Polls of the apiserver's OpenAPI documents (package openapi), by result: unchanged, updated (a document was downloaded), error (the last good documents stay served).",
		"unchanged", "updated", "error")
	m.OpenAPILastSuccess = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cachetier_openapi_last_success_timestamp_seconds",
		Help: "When the OpenAPI documents were last polled successfully, in Unix seconds (0: never; shards never poll; a front answers /openapi/* with 503 until its first success).",
	})
	reg.MustRegister(m.OpenAPIRefreshes, m.OpenAPILastSuccess)
	m.APFConfigSynced = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_priority_and_fairness_config_synced",
		Help: "1 once priority and fairness has read the cluster's FlowSchemas and PriorityLevelConfigurations, 0 before (requests are then classified by the mandatory catch-all level); absent where it does not run (shards).",
	}, nil)
	m.APFLingering = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_priority_and_fairness_lingering_seat_seconds_total",
		Help: "Seat-seconds that LISTs and watch-lists held after they ended, by priority level: the rest of the core such a request ran on, charged so that a level's seats bound its CPU (docs/priority-and-fairness.md). Over the level's current limit, the share of its seats held this way.",
	}, []string{"priority_level"})
	m.SeatCPU = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_seat_cpu_seconds",
		Help: "CPU time this process takes for a seat's worth of a read's work (1,000 objects walked or 1 MiB written), by kind of read (list, watch-list), learned from its own CPU time while it serves them; priority and fairness charges a LIST's or watch-list's seats after it ends by it (a fleet's front adds its shards' list values, which they report; docs/priority-and-fairness.md).",
	}, []string{"kind"})
	m.BulkRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_bulk_requests_total",
		Help: "Requests whose bulk work (a LIST of a seat's worth or more: 1,000 objects walked or 1 MiB written; a large watch-list's initial events) ran on a thread of lower priority (--bulk-request-nice), so that short requests get the cores first; by outcome: lowered, failed (the thread's priority could not be changed, the work ran at the process's own), or unlowered (a fleet shard's part of a front's bulk request, run at the shard's own priority because lowering more would leave no Go P free for its short reads).",
	}, []string{"outcome"})
	// Every outcome from the start: a tier that has served no large
	// request yet shows 0, not no series (the dashboard's rate).
	for _, outcome := range []string{"lowered", "failed", "unlowered"} {
		m.BulkRequests.WithLabelValues(outcome)
	}
	m.RequestDeadlineExceeded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_request_deadline_exceeded_total",
		Help: "Requests other than watches still running at the request deadline (60 s, kube-apiserver's --request-timeout), by verb: cut there, a slow client's LIST releases what it held.",
	}, []string{"verb"})
	for _, verb := range []string{"get", "list"} {
		m.RequestDeadlineExceeded.WithLabelValues(verb)
	}
	reg.MustRegister(m.UpstreamResponses, m.ServingCertExpiry, m.MemoryLimit, m.APFConfigSynced, m.APFLingering, m.SeatCPU, m.BulkRequests, m.RequestDeadlineExceeded)
	reg.MustRegister(m.ShardRequests, m.ShardRequestDuration, m.FleetShardCalls, m.FleetStreamRestarts, m.FleetWatermark, m.FleetShardSeatCPU, m.FleetLatestReadsRefreshed)
	m.TableErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_table_errors_total",
		Help: "Table responses (kubectl get's server-side printing) that could not be built from stored objects, by resource; each is answered with an error Status and logged.",
	}, []string{"resource"})
	m.ListGzipChunks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_list_gzip_chunks_total",
		Help: "Chunks of gzipped JSON LIST bodies and watch-lists' initial events, by resource and result: hit (its compressed bytes were kept from an earlier LIST or watch-list of the same objects), miss (compressed now).",
	}, []string{"resource", "result"})
	m.ListGzipBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cachetier_list_gzip_cache_bytes",
		Help: "Bytes of compressed LIST and watch-list chunks kept for later requests (bounded by --list-gzip-cache-bytes).",
	})
	m.ListGzipEvictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cachetier_list_gzip_cache_evictions_total",
		Help: "Compressed LIST and watch-list chunks dropped to stay within --list-gzip-cache-bytes (least recently used first).",
	})
	reg.MustRegister(m.ListGzipChunks, m.ListGzipBytes, m.ListGzipEvictions)
	m.IndexEntries = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_index_entries",
		Help: "Objects in a field index (a profile's fieldIndexes and the apiserver's own, e.g. pods' spec.nodeName), by resource and indexed field; objects without the field are indexed under the empty value.",
	}, []string{"resource", "index"})
	m.IndexValues = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_index_values",
		Help: "Distinct values in a field index (for spec.nodeName: nodes with pods, plus the empty value of unscheduled pods).",
	}, []string{"resource", "index"})
	m.IndexBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cachetier_index_bytes",
		Help: "Estimated memory of a field index at the latest state: its B-tree nodes plus its entries' key and value bytes counted as not shared with the objects; compare with cachetier_shard_bytes.",
	}, []string{"resource", "index"})
	m.IndexedLists = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cachetier_indexed_lists_total",
		Help: "LIST requests (pages) read through a field index instead of a scan, by resource and indexed field.",
	}, []string{"resource", "index"})
	reg.MustRegister(m.IndexEntries, m.IndexValues, m.IndexBytes, m.IndexedLists)
	reg.MustRegister(m.AuthnConnCache, m.AuthLastKnown, m.AuthzRenewals, m.Impersonation, m.SelectorAuthorizations, m.Goaways, m.MemoryReleased, m.ProtobufConversions, m.TableErrors)
	reg.MustRegister(m.WatchersActive, m.WatchEvents, m.WatchersTerminated, m.WatchListInitial, m.WatchBufferFill, m.WatchDelivery)
	reg.MustRegister(m.WatchDispatchWatchers, m.WatchIndexValues, m.WatchDispatchCandidates)
	reg.MustRegister(m.Requests, m.RequestDuration, m.FreshnessWait, m.RVFetches, m.ProgressProbes, m.ProgressProbeBookmark,
		m.UpstreamEvents, m.UpstreamRelists, m.UpstreamWatchListFallbacks, m.UpstreamRV, m.UpstreamLatestRV,
		m.ShardObjects, m.ShardBytes, m.ShardAppliedRV)
	return m
}

// relistReasons are the reasons upstream ingestion relists with (startup,
// an expired resourceVersion, a failed watch, a progress probe that found
// the stream stuck); terminationReasons those a watch hub closes watchers
// with.
var (
	relistReasons      = []string{"startup", "expired", "error", "progress"}
	terminationReasons = []string{"slow", "shutdown"}
)

// InitResource exports zero for the counters of a cached resource whose
// label values are known in advance (relists, watch-list fallbacks,
// terminated watchers), as Prometheus' instrumentation guidelines ask: a
// counter that has never been incremented would otherwise be absent, so a
// dashboard shows "no data" instead of 0 and rate() has nothing to start
// from when the first increment comes.
func (m *Metrics) InitResource(resource string) {
	for _, r := range relistReasons {
		m.UpstreamRelists.WithLabelValues(resource, r)
	}
	m.UpstreamWatchListFallbacks.WithLabelValues(resource)
	for _, r := range terminationReasons {
		m.WatchersTerminated.WithLabelValues(resource, r)
	}
}

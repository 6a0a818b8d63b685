package front

import (
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/cachetier/cachetier/cache-server/internal/listparams"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// What a request costs the front, for the priority-and-fairness work
// estimator (package apf turns it into seats). kube-apiserver charges a
// LIST served from its watch cache by the resource's whole object count
// (its TODO: "for resources that implement indexes at the watchcache
// level, we need to adjust the cost accordingly"); the front knows what
// it will walk — a namespace's key range, an indexed value's run, or the
// resource — and what it will hold in memory for the response.

// CostKind is what kind of work a request is.
type CostKind string

const (
	// CostOther: not a read of a cached resource (discovery, OpenAPI,
	// /metrics, an error answered before any read).
	CostOther CostKind = "other"
	// CostGet: one object (a GET, or a LIST or watch of one name).
	CostGet CostKind = "get"
	// CostList: a LIST.
	CostList CostKind = "list"
	// CostWatch: a watch without initial events (its work is establishing
	// the stream).
	CostWatch CostKind = "watch"
	// CostWatchList: a watch that starts with the current state
	// (sendInitialEvents, or the legacy resourceVersion ""/"0" watch):
	// a LIST's work, done before its initial-events-end bookmark.
	CostWatchList CostKind = "watchlist"
)

// Cost is the work of one request.
type Cost struct {
	Kind CostKind
	// Walked is the number of objects the read visits (a selector is
	// evaluated on each), Returned those it writes (at most Walked) and
	// Bytes their stored bytes.
	Walked, Returned, Bytes int64
	// Held is what the response is charged for holding beyond the
	// stored objects: the body for the protobuf, metadata-only and Table
	// LISTs (a Table tableHeldFactor times), a fleet front's page, 0 for
	// JSON LISTs and watch-lists. writeList streams every form now, so
	// for the first three this is no longer memory held at once but the
	// encoding work bytesPerSeat does not price (a conversion or decode
	// per object; a Table decodes and prints every object); the charge
	// is kept until it is measured as CPU (issue 21).
	Held int64
	// ShardSeatCPU is the CPU that the processes behind the source take
	// per seat's worth of the read, beside this one's own: a fleet's
	// shards (ShardCoster); 0 for a local store.
	ShardSeatCPU time.Duration
}

// Sizer is a Source that can tell how many objects a read walks:
// LocalSource exactly (store.Store.Count), a fleet's Source by the
// shards' reported averages.
type Sizer interface {
	// Count is the objects a read of namespace ns ("" = all),
	// restricted to iv when iv.Field is set, walks, and their bytes.
	Count(ns string, iv store.IndexValue) (objects, bytes int64)
}

// ShardCoster is a Source whose reads are also other processes' work: a
// fleet's Source, whose shards report the CPU they take per seat's
// worth of work (package seatcpu).
type ShardCoster interface {
	ShardSeatCPU() time.Duration
}

// Count reads the store's counts.
func (l LocalSource) Count(ns string, iv store.IndexValue) (objects, bytes int64) {
	return l.Store().Count(ns, iv)
}

// tableHeldFactor is how many times its JSON a Table's objects take while
// it is built: every object decoded (a map of maps, or a typed object for
// the apiserver's printers), then its row. An estimate of decoded Go
// objects over their JSON (3-5× for typical Pods and ConfigMaps), with
// the row on top.
const tableHeldFactor = 5

// Cost estimates what r costs. info is the request's RequestInfo as the
// authorization filter sees it (below the aggregated prefix).
func (s *Server) Cost(r *http.Request, info *request.RequestInfo) Cost {
	if info == nil || !info.IsResourceRequest || info.Subresource != "" {
		return Cost{Kind: CostOther}
	}
	res, ok := s.resources[schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource}]
	if !ok {
		return Cost{Kind: CostOther}
	}
	ns := info.Namespace
	if !res.APIResource.Namespaced {
		ns = ""
	}
	// A name (a GET, or a LIST/watch with metadata.name=<name>, which
	// RequestInfo puts in Name) reads one object.
	one := Cost{Kind: CostGet, Walked: 1, Returned: 1}
	switch info.Verb {
	case "get":
		return one
	case "list", "watch":
	default:
		return Cost{Kind: CostOther}
	}
	verb := listparams.List
	if info.Verb == "watch" {
		verb = listparams.Watch
	}
	p, err := listparams.Parse(r.URL.Query(), verb, listparams.Options{
		Namespace: ns, ConvertFieldLabel: res.Entry.Fields.ConvertFieldLabel,
	})
	if err != nil {
		// Refused at once with the apiserver's error.
		return Cost{Kind: CostOther}
	}
	if info.Verb == "watch" && !p.InitialEvents {
		return Cost{Kind: CostWatch}
	}
	if info.Name != "" {
		if info.Verb == "watch" {
			one.Kind = CostWatchList
		}
		return one
	}
	var iv store.IndexValue
	if info.Verb == "watch" {
		iv, _ = p.IndexValue(res.Entry.FieldIndexes)
	} else {
		iv, _ = p.ListIndex(res.Entry.FieldIndexes, res.Entry.Fields.APIServerIndexes(), !res.Source.UpstreamUncached())
	}
	sizer, ok := res.Source.(Sizer)
	if !ok {
		return Cost{Kind: CostOther}
	}
	objects, bytes := sizer.Count(ns, iv)
	c := Cost{Kind: CostList, Walked: objects, Returned: objects, Bytes: bytes}
	if sc, ok := res.Source.(ShardCoster); ok {
		c.ShardSeatCPU = sc.ShardSeatCPU()
	}
	if info.Verb == "watch" {
		c.Kind = CostWatchList
		return c
	}
	limit := p.Limit
	if p.ResourceVersion == "0" && res.Source.UpstreamUncached() && p.ListOptions.Limit > 0 {
		limit = p.ListOptions.Limit // as serveList
	}
	if limit > 0 && limit < objects {
		// A page: an unfiltered one walks only the page; a filtered one
		// walks until it found limit matches, at most the whole range.
		c.Returned = limit
		if p.LabelSelector.Empty() && (p.FieldSelector.Empty() || iv.Field != "") {
			c.Walked = limit
		}
		if objects > 0 {
			c.Bytes = bytes * limit / objects
		}
	}
	enc, err := negotiateFor(res, r.Header.Get("Accept"), true)
	if err != nil {
		return Cost{Kind: CostOther}
	}
	_, streamer := res.Source.(ItemStreamer)
	switch {
	case enc == encTable:
		c.Held = c.Bytes * tableHeldFactor
	case enc != encJSON:
		c.Held = c.Bytes
	case streamer && limit > 0:
		c.Held = c.Bytes // streamList's page buffer
	}
	return c
}

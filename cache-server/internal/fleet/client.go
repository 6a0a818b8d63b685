// Package fleet is a front's view of a fleet's shards: a front.Source per
// resource that reads pages and single objects from the shards at one RV
// and merges them by key, and a watch hub fed by the shards' change streams
// merged in RV order by watermark.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// Client calls the shards of one topology.
type Client struct {
	http    *http.Client
	topo    *topology.Topology
	metrics *metrics.Metrics
	pools   *shardwire.Pools
	// next rotates the replica tried first, per shard, so reads spread
	// over replicas.
	next []atomic.Uint32
}

// NewClient returns a client that reaches shards with httpClient (TLS
// trusting the shards' CA, carrying the front's credentials).
func NewClient(httpClient *http.Client, topo *topology.Topology, m *metrics.Metrics) *Client {
	return &Client{http: httpClient, topo: topo, metrics: m, pools: shardwire.NewPools(), next: make([]atomic.Uint32, len(topo.Shards))}
}

// stream is an open shard response.
type stream struct {
	r    *shardwire.Reader
	body io.ReadCloser
	// ended: the answer's last record (end of a list, an error) was read.
	ended bool
	// endpoint is the replica answering.
	endpoint string
	// release returns the body's decoder, if any; pools takes r back.
	release func()
	pools   *shardwire.Pools
}

// Next reads the next record.
func (s *stream) Next() (shardwire.Record, error) {
	rec, err := s.r.Next()
	if err == nil && (rec.Kind == shardwire.KindEnd || rec.Kind == shardwire.KindError) {
		s.ended = true
	}
	return rec, err
}

// Close ends the response. A finished answer is read to its end (the
// chunked body's terminator) so the HTTP/1.1 connection goes back to the
// pool; an unfinished one (a change stream, a scan whose client left) is
// closed at once, which closes its connection.
func (s *stream) Close() error {
	if s.ended {
		_, _ = io.CopyN(io.Discard, s.body, 4<<10)
	}
	err := s.body.Close()
	if s.release != nil {
		s.release()
		s.release = nil
	}
	if s.pools != nil {
		s.pools.PutReader(s.r)
		s.pools, s.r = nil, nil
	}
	return err
}

// open sends a shard request to one replica of shard i, trying the others
// when one cannot be reached or is still loading (429). A replica that
// answers with another HTTP error (authentication, authorization) is an
// answer, not a reason to try the next one.
func (c *Client) open(ctx context.Context, i int, path string, q url.Values) (*stream, error) {
	return c.openPreferring(ctx, i, "", path, q)
}

// openPreferring is open trying the replica at endpoint prefer first (when
// set and in the topology), then the others.
func (c *Client) openPreferring(ctx context.Context, i int, prefer, path string, q url.Values) (*stream, error) {
	sh := c.topo.Shards[i]
	verb := strings.TrimPrefix(path, "/shard/v1/")
	endpoints := sh.Endpoints
	if k := slices.Index(endpoints, prefer); k >= 0 {
		endpoints = append([]string{prefer}, slices.Delete(slices.Clone(endpoints), k, k+1)...)
	} else {
		first := int(c.next[i].Add(1)) % len(endpoints)
		endpoints = append(slices.Clone(endpoints[first:]), endpoints[:first]...)
	}
	// Every request says which hash shards the front expects, so that a
	// replica holding another range (the shard count is changing) refuses
	// instead of answering for a different set of objects.
	q = maps.Clone(q)
	if q == nil {
		q = url.Values{}
	}
	shardwire.SetHashRange(q, shardwire.HashRange{First: int(sh.FirstHashShard), Last: int(sh.LastHashShard), Total: int(c.topo.HashShards)})
	var lastErr error
	initializing, misdirected := false, false
	for _, ep := range endpoints {
		u := url.URL{Scheme: "https", Host: ep, Path: path, RawQuery: q.Encode()}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, err
		}
		if path == shardwire.PathList {
			req.Header.Set("Accept-Encoding", shardwire.EncodingS2)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = err
			continue
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			// This replica is still loading (a pod that just started: the
			// shards' headless Service publishes replicas before they are
			// ready, so their DNS names exist from the start). Another
			// replica may have the data.
			resp.Body.Close()
			initializing, lastErr = true, fmt.Errorf("%s is loading its data", ep)
			continue
		}
		if resp.StatusCode == shardwire.StatusMisdirected {
			// This replica holds other hash shards: it rolled onto a new
			// range this front's topology does not know yet, or has not
			// rolled onto the range it does. Another replica may hold ours.
			lastErr = httpError(sh.Name, resp)
			resp.Body.Close()
			misdirected = true
			continue
		}
		if resp.StatusCode != http.StatusOK {
			err := httpError(sh.Name, resp)
			resp.Body.Close()
			c.metrics.FleetShardCalls.WithLabelValues(sh.Name, verb, "error").Inc()
			return nil, err
		}
		c.metrics.FleetShardCalls.WithLabelValues(sh.Name, verb, "ok").Inc()
		st := &stream{body: resp.Body, endpoint: ep}
		var body io.Reader = resp.Body
		switch ce := resp.Header.Get("Content-Encoding"); ce {
		case "":
		case shardwire.EncodingS2:
			body, st.release = c.pools.Decoder(resp.Body)
		default:
			resp.Body.Close()
			return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("shard %s answered in an unknown encoding %q", sh.Name, ce))
		}
		st.r, st.pools = c.pools.Reader(body), c.pools
		return st, nil
	}
	if initializing {
		// As the apiserver's cacher answers while it initializes: the
		// client retries after a second.
		c.metrics.FleetShardCalls.WithLabelValues(sh.Name, verb, "initializing").Inc()
		return nil, apierrors.NewTooManyRequests(fmt.Sprintf("shard %s is (re)initializing: %v", sh.Name, lastErr), 1)
	}
	if misdirected {
		// Reads wait or fail (503, retried by clients) rather than
		// answer for a different set of objects; the rollout that changes
		// the shard count replaces this front.
		c.metrics.FleetShardCalls.WithLabelValues(sh.Name, verb, "misdirected").Inc()
		return nil, retryableUnavailable(fmt.Sprintf("no replica of shard %s holds hash shards %s (the shard count is changing): %v", sh.Name, q.Get(shardwire.ParamHashShards), lastErr))
	}
	c.metrics.FleetShardCalls.WithLabelValues(sh.Name, verb, "unreachable").Inc()
	return nil, retryableUnavailable(fmt.Sprintf("shard %s is unreachable: %v", sh.Name, lastErr))
}

// retryableUnavailable is a 503 whose client is told to try again in a
// second (Retry-After, which client-go honours up to ten times): a shard
// none of whose replicas answered this moment is most often one whose
// replicas are being replaced (a drain, a lost node), as the apiserver's
// own cache answers 429 with Retry-After while it initializes.
func retryableUnavailable(msg string) error {
	err := apierrors.NewServiceUnavailable(msg)
	err.ErrStatus.Details = &metav1.StatusDetails{RetryAfterSeconds: 1}
	return err
}

// httpError turns a shard's HTTP error (its auth filters answer with a
// Status) into an error for the front's client.
func httpError(shard string, resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var st metav1.Status
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
		// Relayed as unavailability: the client's own request was
		// authorized by the front; a shard refusing the front is a fleet
		// misconfiguration, not the client's error.
		return apierrors.NewServiceUnavailable(fmt.Sprintf("shard %s refused the front: %d %s", shard, st.Code, st.Message))
	}
	return apierrors.NewServiceUnavailable(fmt.Sprintf("shard %s answered %s", shard, resp.Status))
}

// call opens a request whose answer is one record (a watermark) or an error.
func (c *Client) call(ctx context.Context, i int, prefer, path string, q url.Values) (shardwire.Record, error) {
	s, err := c.openPreferring(ctx, i, prefer, path, q)
	if err != nil {
		return shardwire.Record{}, err
	}
	defer s.Close()
	rec, err := s.Next()
	if err != nil {
		return shardwire.Record{}, c.readError(i, err)
	}
	// A call's answer is this one record (a watermark: not a list's end
	// record): read the body to its end on Close so the connection is
	// reused. Closed unread, every consistent read cost the front and
	// the shards three new TLS connections (current RV, a wait per shard).
	s.ended = true
	if rec.Kind == shardwire.KindError {
		return rec, rec.Header.Error.Err()
	}
	return rec, nil
}

// replicaError is an error a replica answered in its stream, with the
// replica it came from.
type replicaError struct {
	endpoint string
	err      error
}

func (e *replicaError) Error() string { return e.err.Error() }
func (e *replicaError) Unwrap() error { return e.err }

// withoutReplica is err as the replica answered it.
func withoutReplica(err error) error {
	if re, ok := err.(*replicaError); ok {
		return re.err
	}
	return err
}

// otherReplica is the replica of shard i to ask after err: the one after
// the replica that answered it, when err says that replica holds no state
// at the RV asked for (store.ExpiredError) — a replica that restarted
// keeps nothing from before its load's RV, while one that kept running
// still has it, and a front reads at its merged watermark, which can be
// below a restarted replica's load. "" when another replica would answer
// the same.
func (c *Client) otherReplica(i int, err error) string {
	var re *replicaError
	var expired *store.ExpiredError
	if !errors.As(err, &re) || !errors.As(err, &expired) {
		return ""
	}
	eps := c.topo.Shards[i].Endpoints
	k := slices.Index(eps, re.endpoint)
	if k < 0 || len(eps) < 2 {
		return ""
	}
	return eps[(k+1)%len(eps)]
}

// askReplicas runs read against shard i, first with prefer "" (any
// replica), then, while otherReplica names one, against the shard's other
// replicas, each at most once; it returns read's last error as the replica
// answered it.
func (c *Client) askReplicas(i int, read func(prefer string) error) error {
	prefer := ""
	for tries := 1; ; tries++ {
		err := read(prefer)
		if err == nil {
			return nil
		}
		if prefer = c.otherReplica(i, err); prefer == "" || tries >= len(c.topo.Shards[i].Endpoints) {
			return withoutReplica(err)
		}
	}
}

// readError is a shard's answer cut short: its replica went away mid-way
// (another one may answer the same request).
func (c *Client) readError(i int, err error) error {
	return retryableUnavailable(fmt.Sprintf("reading from shard %s: %v", c.topo.Shards[i].Name, err))
}

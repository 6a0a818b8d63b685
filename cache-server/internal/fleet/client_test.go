package fleet

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachetier/cachetier/api/topology"
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/shardwire"
)

// TestCallReusesConnections: one-record calls (current RV, wait) leave
// their HTTP/1.1 connection to the next call. A consistent read makes one
// per shard and more; a new TLS connection for each was a handshake on
// the front and on the shard per read.
func TestCallReusesConnections(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// As the shard server does: the record is flushed as a chunk of
		// its own, the body's end follows when the handler returns.
		out := shardwire.NewWriter(w)
		_ = out.Watermark(42, false)
		_ = out.Flush()
		_ = http.NewResponseController(w).Flush()
		time.Sleep(5 * time.Millisecond)
	}))
	srv.EnableHTTP2 = false // the fleet's shard client speaks HTTP/1.1
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	topo := &topology.Topology{HashShards: 1, Shards: []topology.Shard{{Name: "s0", FirstHashShard: 0, LastHashShard: 0,
		Replicas: 1, Endpoints: []string{strings.TrimPrefix(srv.URL, "https://")}}}}
	c := NewClient(srv.Client(), topo, metrics.New(prometheus.NewRegistry()))
	for _, path := range []string{shardwire.PathCurrentRV, shardwire.PathWait, shardwire.PathCurrentRV, shardwire.PathWait, shardwire.PathCurrentRV} {
		rec, err := c.call(context.Background(), 0, "", path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Kind != shardwire.KindWatermark || rec.Header.RV != 42 {
			t.Fatalf("%s answered %+v, want the watermark 42", path, rec)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 sequential calls opened %d connections, want 1", n)
	}
}

package ingest

import (
	"github.com/cachetier/cachetier/cache-server/internal/metrics"
	"github.com/cachetier/cachetier/cache-server/internal/store"
)

// reportIndexStats publishes the size of each of a resource's field
// indexes (entries, distinct values, estimated bytes), so that an operator
// can hold the index's memory against the cached bytes
// (cachetier_shard_bytes).
func reportIndexStats(resource string, st *store.Store, m *metrics.Metrics) {
	for _, ix := range st.IndexStats() {
		m.IndexEntries.WithLabelValues(resource, ix.Field).Set(float64(ix.Entries))
		m.IndexValues.WithLabelValues(resource, ix.Field).Set(float64(ix.Values))
		m.IndexBytes.WithLabelValues(resource, ix.Field).Set(float64(ix.Bytes))
	}
}

package front

import (
	"context"

	"github.com/cachetier/cachetier/cache-server/internal/store"
	"github.com/cachetier/cachetier/cache-server/internal/upstream"
)

// Source is where the front reads one resource from: the ingester and store
// of this process (standalone, LocalSource) or the shards of a fleet
// (package fleet). Reads at snapshotRV 0 mean "the latest state"; errors are
// the store's (*store.TooLargeResourceVersionError, *store.ExpiredError) or
// API status errors.
type Source interface {
	// Synced is closed once the resource's initial state is loaded.
	Synced() <-chan struct{}
	// CurrentRV is the apiserver's current RV for the resource, fetched
	// after the call started (consistent reads).
	CurrentRV(ctx context.Context) (uint64, error)
	// WaitFresh returns once the source has applied rv.
	WaitFresh(ctx context.Context, rv uint64) error
	// AppliedRV is the RV the source has applied.
	AppliedRV() uint64
	// UpstreamUncached: the apiserver serves the resource without a watch
	// cache (it honours limit with resourceVersion=0).
	UpstreamUncached() bool
	Get(key string, snapshotRV uint64) (*store.Object, uint64, error)
	List(req store.ListRequest) (store.ListResult, error)
}

// LocalSource reads from an ingester in this process.
type LocalSource struct{ *upstream.Ingester }

var _ Source = LocalSource{}

func (l LocalSource) Get(key string, snapshotRV uint64) (*store.Object, uint64, error) {
	return l.Store().Get(key, snapshotRV)
}

func (l LocalSource) List(req store.ListRequest) (store.ListResult, error) {
	return l.Store().List(req)
}

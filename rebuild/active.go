package rebuild

import (
	"context"
	"fmt"
	"strings"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// InProgress returns the rebuilds still replaying, waiting to switch or
// swapping an external target in (a Meilisearch index), of
// every projection, oldest first, with their progress. Unlike [List] it
// only reads: an in-place rebuild that has replayed everything is left out
// rather than recorded done, so a role that may only read the schema (a
// monitoring job running `projector status`) can call it.
func InProgress(ctx context.Context, store *postgres.Store) ([]Rebuild, error) {
	rows, err := store.Pool().Query(ctx, selectRebuilds(store, `WHERE r.status IN ('building', 'ready', 'swapping') ORDER BY r.id`))
	if err != nil {
		return nil, fmt.Errorf("rebuild: list those in progress: %w", err)
	}
	rs, finished, err := scanRebuilds(store, rows)
	if err != nil {
		return nil, fmt.Errorf("rebuild: list those in progress: %w", err)
	}
	out := rs[:0]
	for i, r := range rs {
		if !finished[i] {
			out = append(out, r)
		}
	}
	return out, nil
}

// ForShard returns the active rebuild among rebuilds that shard carries
// out, nil if none: a blue/green or inline rebuild runs on its shadow shard
// (projection.RebuildInstance), one in place on the live shared shard (and
// a partitioned consumer's partitions). The
// CLI's status and the console show it beside the shard.
func ForShard(rebuilds []Rebuild, shard projection.ShardID) *Rebuild {
	for i, r := range rebuilds {
		if r.Name != shard.Consumer || !r.Active() {
			continue
		}
		if ((r.Mode == BlueGreen || r.Mode == InlineRebuild) && shard.Instance == projection.RebuildInstance) ||
			(r.Mode == InPlace && (shard.Instance == projection.SharedInstance || shard.Instance == "" || strings.HasPrefix(shard.Instance, projection.PartitionPrefix))) {
			return &rebuilds[i]
		}
	}
	return nil
}

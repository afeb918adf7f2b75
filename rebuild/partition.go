package rebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Rebuilds of a partitioned consumer (docs/rebuilds.md, "Partitioned
// consumers"). Blue/green: the shadow shard builds unpartitioned and
// switches in with every partition at its cursor (projection's
// rebuild_partition.go). In place: lockPartitions, then every partition is
// rewound at once (startInPlace) and replays its own streams up to where it
// stood. Partial rebuilds are refused (partial.go).

// ErrMergeUnderWay: an in-place rebuild of a partitioned consumer was
// requested while a merge holds some of its partitions (docs/scaling.md,
// "Splitting and merging live").
var ErrMergeUnderWay = errors.New("rebuild: a merge of the consumer's partitions is under way")

// lockPartitions waits, in tx, for the lock of every partition of the
// partitioned consumer name, in partition order (a pass holds one
// partition's lock at a time, and a switching shadow pass and another
// request wait in the same order, so the waits cannot deadlock), and then reads their statuses: "disabled" if
// any partition is, since an in-place rebuild would clear its streams'
// rows for a replay no dispatcher runs.
func lockPartitions(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string) (string, error) {
	c := store.Table("projector_consumers")
	rows, err := tx.Query(ctx, `SELECT instance_id FROM `+c+` WHERE name = $1 AND starts_with(instance_id, $2)`,
		name, projection.PartitionPrefix)
	if err != nil {
		return "", fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	// In the order a switching shadow pass waits for them.
	slices.SortFunc(ids, projection.PartitionOrder)
	for _, id := range ids {
		if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: name, Instance: id}); err != nil {
			return "", err
		}
	}
	var disabled bool
	var held string
	if err := tx.QueryRow(ctx, `SELECT coalesce(bool_or(status = 'disabled'), false),
			coalesce(min(instance_id) FILTER (WHERE hold_tx_id IS NOT NULL), '')
		FROM `+c+` WHERE name = $1 AND starts_with(instance_id, $2)`,
		name, projection.PartitionPrefix).Scan(&disabled, &held); err != nil {
		return "", fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	if held != "" {
		// A merge holds the partition and its sibling at one position
		// until both stand there; rewinding them would spoil that (and the
		// merged partition would not know where to replay to). Holds are
		// set under the partitions' locks, held here.
		return "", fmt.Errorf("%w: partition %s of %s is held for a merge under way; let it finish (`projector consumer merge %s` finishes one that was interrupted), then rebuild",
			ErrMergeUnderWay, held[len(projection.PartitionPrefix):], name, name)
	}
	if disabled {
		return string(projection.StatusDisabled), nil
	}
	return string(projection.StatusIdle), nil
}

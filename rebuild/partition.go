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
// partitioned consumer name, in PartitionOrder (projection.LockPartitions:
// the order a switching shadow pass, a partial rebuild, a split and a merge
// take them in, so the waits cannot deadlock), and then reads their
// statuses: "disabled" if any partition is, since an in-place rebuild would
// clear its streams' rows for a replay no dispatcher runs.
//
// tx must hold the consumer's fence lock (the lock of its unpartitioned
// shard, which Start takes first): splits and merges take it too, so none
// commits between the read of the partitions and their locks, which would
// leave the new halves unlocked while they are rewound. The partitions are
// read again under the locks all the same; only `consumer remove`, which
// refuses a consumer with a pass running, changes them without the fence.
func lockPartitions(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string) (string, error) {
	ids, err := partitionIDs(ctx, tx, store, name)
	if err != nil {
		return "", err
	}
	if err := projection.LockPartitions(ctx, tx, store, name, ids); err != nil {
		return "", err
	}
	again, err := partitionIDs(ctx, tx, store, name)
	if err != nil {
		return "", err
	}
	if !slices.Equal(again, ids) {
		return "", fmt.Errorf("%w: rebuild %s: its partitions changed while they were being locked; request the rebuild again", projection.ErrLayoutChanged, name)
	}
	var disabled bool
	var held string
	if err := tx.QueryRow(ctx, `SELECT coalesce(bool_or(status = 'disabled'), false),
			coalesce(min(instance_id) FILTER (WHERE hold_tx_id IS NOT NULL), '')
		FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND starts_with(instance_id, $2)`,
		name, projection.PartitionPrefix).Scan(&disabled, &held); err != nil {
		return "", fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	if held != "" {
		// A merge holds the partition and its sibling at one position
		// until both stand there; rewinding them would spoil that (and the
		// merged partition would not know where to replay to). Holds are
		// set under the consumer's fence lock, held here.
		return "", fmt.Errorf("%w: partition %s of %s is held for a merge under way; let it finish (`projector consumer merge %s` finishes one that was interrupted), then rebuild",
			ErrMergeUnderWay, held[len(projection.PartitionPrefix):], name, name)
	}
	if disabled {
		return string(projection.StatusDisabled), nil
	}
	return string(projection.StatusIdle), nil
}

// partitionIDs reads, in tx, the instance ids of name's partitions, in
// PartitionOrder.
func partitionIDs(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT instance_id FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND starts_with(instance_id, $2)`,
		name, projection.PartitionPrefix)
	if err != nil {
		return nil, fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	slices.SortFunc(ids, projection.PartitionOrder)
	return ids, nil
}

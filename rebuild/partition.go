package rebuild

import (
	"context"
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
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+c+` WHERE name = $1 AND starts_with(instance_id, $2) AND status = 'disabled')`,
		name, projection.PartitionPrefix).Scan(&disabled); err != nil {
		return "", fmt.Errorf("rebuild %s: read its partitions: %w", name, err)
	}
	if disabled {
		return string(projection.StatusDisabled), nil
	}
	return string(projection.StatusIdle), nil
}

package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Partial rebuilds of a partitioned consumer (docs/rebuilds.md,
// "Partitioned consumers"). A stream lives in one partition, by its hash,
// and each partition has its own cursor, so the rest of the model holds
// each stream's events up to its own partition's cursor; the scope is
// rebuilt to exactly that, under the lock of every partition it touches:
//
//   - the consumer's fence lock (its unpartitioned shard's, which Partial
//     takes first) keeps the layout still: splits, merges (setting holds
//     and swapping rows) and a starting dispatcher's registration take it
//     too, so they wait for the rebuild or the rebuild waits for them,
//     and neither sees the other half done;
//   - the affected partitions' locks, taken in partition order (the order
//     an in-place rebuild and a blue/green switch take them in, so the
//     waits cannot deadlock), keep their passes out: each waits for a
//     running batch, and the live passes skip them until the commit. A
//     stream scope touches one partition, and the others keep running; a
//     tenant scope touches every partition (its streams are everywhere);
//   - the cursors are read after the locks, the scope's events read up to
//     the latest of them, and each event replayed only when it is at or
//     before its own partition's cursor: an event after it is the live
//     partition's to apply once the rebuild commits, so nothing is applied
//     twice or skipped, whatever the partitions' distances apart;
//   - dead letters are looked up, recorded and resolved under each event's
//     partition, where its stream's dead letters live.
//
// A hold set by a merge under way is left as it is: a held partition's
// cursor is a cursor like any other, and the merge swaps the rows once the
// rebuild has committed.

// PartitionCursor is where one partition of a partitioned consumer stood
// when a partial rebuild replayed its part of the scope.
type PartitionCursor struct {
	Partition postgres.Segment
	Until     projector.Position
}

// partialPartitioned is Partial's steps 2 to 4 for a partitioned consumer,
// in tx, which holds the consumer's fence lock.
func partialPartitioned(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *projection.Async, scope projection.Scope, batch int,
	logger *slog.Logger, res *PartialResult) error {
	name, c := p.Name(), store.Table("projector_consumers")
	var note string
	if err := tx.QueryRow(ctx, `SELECT coalesce(last_error, '') FROM `+c+` WHERE name = $1 AND instance_id = $2`,
		name, projection.SharedInstance).Scan(&note); err != nil {
		return fmt.Errorf("partial rebuild of %s: read its fence: %w", name, err)
	}
	if projection.KeyedFenceNote(note) {
		return fmt.Errorf("%w: %s is partitioned by key (a saga's correlation key), not by stream: its partitions cannot be told from a scope's streams", ErrNotRebuildable, name)
	}
	rows, err := tx.Query(ctx, `SELECT instance_id FROM `+c+` WHERE name = $1 AND starts_with(instance_id, $2)`, name, projection.PartitionPrefix)
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: read its partitions: %w", name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: read its partitions: %w", name, err)
	}
	// The partitions the scope touches: a stream's one, or all of them.
	segs := map[string]postgres.Segment{}
	ref, stream := scope.Stream()
	var streamHash uint32
	if stream {
		streamHash = postgres.StreamHash(ref.Tenant, ref.Type, ref.ID)
	}
	var affected []string
	for _, id := range ids {
		pn, n, ok := projection.ParsePartition(id)
		if !ok {
			continue
		}
		seg, err := postgres.SegmentOf(pn, n)
		if err != nil || (stream && !seg.Contains(streamHash)) {
			continue
		}
		segs[id] = seg
		affected = append(affected, id)
	}
	if len(affected) == 0 {
		return fmt.Errorf("%w: %s is partitioned and has no partition holding %s (its partitions were removed?); a dispatcher registers them when it starts", ErrNotRebuildable, name, scope)
	}
	slices.SortFunc(affected, projection.PartitionOrder)
	if err := projection.LockPartitions(ctx, tx, store, name, affected); err != nil {
		return err
	}
	// Read after the locks (promise 6): a pass that held one committed
	// its cursor before the lock was granted.
	rows, err = tx.Query(ctx, `SELECT instance_id, cursor_tx_id, cursor_seq, version FROM `+c+` WHERE name = $1 AND instance_id = ANY($2)`, name, affected)
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: read its partitions: %w", name, err)
	}
	cursors := map[string]projector.Position{}
	var id string
	var cur projector.Position
	var version int
	_, err = pgx.ForEachRow(rows, []any{&id, &cur.TxID, &cur.Seq, &version}, func() error {
		if version != p.Config().Version {
			return fmt.Errorf("%w: partition %s of %s is at model version %d and this binary's projection is version %d: run the partial rebuild with the binary of the live version",
				ErrNotRebuildable, segs[id], name, version, p.Config().Version)
		}
		cursors[id] = cur
		return nil
	})
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: %w", name, err)
	}
	if len(cursors) != len(affected) {
		// The fence lock keeps splits and merges out; only `consumer
		// remove` deletes partition rows without it.
		return fmt.Errorf("%w: partial rebuild of %s: its partitions were removed meanwhile", projection.ErrLayoutChanged, name)
	}
	res.Partitions = make([]PartitionCursor, len(affected))
	for i, id := range affected {
		res.Partitions[i] = PartitionCursor{Partition: segs[id], Until: cursors[id]}
		if res.Until.Less(cursors[id]) {
			res.Until = cursors[id]
		}
	}

	if err := projection.ClearScopeTx(ctx, tx, store, p, scope); err != nil {
		if errors.Is(err, projection.ErrScopeUnsupported) {
			return fmt.Errorf("%w: %w", ErrNotRebuildable, err)
		}
		return err
	}
	sc, err := store.OpenScopeTx(ctx, tx, postgres.ScopeQuery{Tenant: scope.Tenant, StreamType: scope.StreamType, StreamID: scope.StreamID,
		EventTypes: p.EventTypes(), Until: res.Until, Raw: true})
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: %w", name, err)
	}
	type streamKey struct{ tenant, typ, id string }
	owner := map[streamKey]string{} // a stream's partition, hashed once
	partitionOf := func(ev projector.Event) string {
		k := streamKey{ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID}
		if id, ok := owner[k]; ok {
			return id
		}
		h := postgres.StreamHash(k.tenant, k.typ, k.id)
		out := ""
		for _, id := range affected {
			if segs[id].Contains(h) {
				out = id
				break
			}
		}
		owner[k] = out
		return out
	}
	for {
		events, err := sc.Next(ctx, batch)
		if err != nil {
			return fmt.Errorf("partial rebuild of %s: %w", name, err)
		}
		if len(events) == 0 {
			break
		}
		// Each partition's events of the batch, in log order (so each
		// stream's in version order), up to that partition's cursor.
		groups := map[string][]projector.Event{}
		for _, ev := range events {
			id := partitionOf(ev)
			if id == "" {
				// The partitions cover every hash (the layout is the
				// fence's to keep whole); a gap is a removed row.
				return fmt.Errorf("%w: partial rebuild of %s: no partition holds stream %s", projection.ErrLayoutChanged, name, ev.Stream)
			}
			if cursors[id].Less(ev.Position) {
				res.LeftToLive++ // its partition applies it after the commit
				continue
			}
			groups[id] = append(groups[id], ev)
		}
		for _, id := range affected {
			if len(groups[id]) == 0 {
				continue
			}
			r, err := projection.ReplayShardTx(ctx, tx, store, p, id, groups[id], logger)
			res.Events += r.Applied + r.DeadLettered
			res.DeadLettered += r.DeadLettered
			res.ResolvedDeadLetters += r.Resolved
			if err != nil {
				return fmt.Errorf("partial rebuild of %s, %s, partition %s: %w", name, scope, segs[id], err)
			}
		}
	}
	if err := sc.Close(ctx); err != nil {
		return fmt.Errorf("partial rebuild of %s: %w", name, err)
	}
	return nil
}

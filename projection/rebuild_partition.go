package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector/stores/postgres"
)

// Blue/green rebuilds of a partitioned consumer (docs/rebuilds.md,
// "Partitioned consumers").
//
// The shadow shard builds unpartitioned: one cursor over the whole log, as
// for any consumer, replaying no further than the earliest partition's
// cursor (rebuild_live.go). It switches in under every live partition's
// lock (none can move while its lock is held), in the transaction that has
// just applied, from there on to the latest partition's cursor, each event
// at or below its own partition's (rebuild_gap.go): every partition keeps
// its own cursor, at the new version, and handles the rest live. The fence
// row (version PartitionedVersion) stays.
// The partitions are the rows the consumer has when the switch locks them,
// whatever segments they are; a version that declares no partitions never
// switches a partitioned consumer (nor a partitioned version an
// unpartitioned one).

// liveShards returns, read in tx, the shards a shadow shard of sh's
// projection switches in for: the unpartitioned shard, or every partition
// row the consumer has now, in PartitionOrder — the rows, not the declared
// count, so whatever segments the partitions are, all of them switch.
func (d *Dispatcher) liveShards(ctx context.Context, tx pgx.Tx, sh *shard) ([]ShardID, error) {
	if sh.proj.cfg.Partitions <= 1 {
		return []ShardID{{Consumer: sh.id.Consumer, Instance: SharedInstance}}, nil
	}
	rows, err := tx.Query(ctx, d.psql.partitions, sh.id.Consumer)
	if err != nil {
		return nil, fmt.Errorf("shadow pass: read the partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("shadow pass: read the partitions: %w", err)
	}
	slices.SortFunc(names, PartitionOrder)
	ids := make([]ShardID, len(names))
	for i, n := range names {
		ids[i] = ShardID{Consumer: sh.id.Consumer, Instance: n}
	}
	return ids, nil
}

// PartitionOrder orders partition instance ids by where their hash segment
// starts (then by size): the one order in which whatever waits for several
// partitions' locks takes them, so two such waits never deadlock.
func PartitionOrder(a, b string) int {
	pa, na, _ := ParsePartition(a)
	pb, nb, _ := ParsePartition(b)
	return cmp.Or(cmp.Compare(pa*postgres.MaxPartitions/max(na, 1), pb*postgres.MaxPartitions/max(nb, 1)), cmp.Compare(na, nb), cmp.Compare(a, b))
}

// LockPartitions waits, in tx, for the advisory lock of each partition of
// consumer named by instances (partition instance ids), in PartitionOrder
// whatever order they are given in: the one helper every path that holds
// several partitions' locks at once takes them with (an in-place rebuild,
// a partial rebuild, a blue/green switch, a split, a merge), so no two of
// them can each hold a lock the other waits for. Passes hold one
// partition's lock at a time. A lock that cannot be taken (lock_timeout,
// cancellation) is returned wrapped, the locks taken before it still held.
func LockPartitions(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string, instances []string) error {
	ids := partitionsInOrder(instances)
	// One round trip for them all: the statements of a pipeline run one
	// after another, in the order queued, each waiting for its lock, so
	// the order is kept without a round trip between two locks (time the
	// partitions locked first would stand still).
	b := &pgx.Batch{}
	queueLockPartitions(b, store, consumer, ids)
	return readLockPartitions(tx.SendBatch(ctx, b), consumer, ids)
}

// partitionsInOrder returns instances sorted in PartitionOrder, each once.
func partitionsInOrder(instances []string) []string {
	ids := slices.Clone(instances)
	slices.SortFunc(ids, PartitionOrder)
	return slices.Compact(ids)
}

// queueLockPartitions queues on b the wait for each lock of ids (in
// PartitionOrder already, partitionsInOrder).
func queueLockPartitions(b *pgx.Batch, store *postgres.Store, consumer string, ids []string) {
	for _, id := range ids {
		b.Queue(waitShardLockSQL, shardLockKey(store.Schema(), ShardID{Consumer: consumer, Instance: id}.normal()))
	}
}

// readLockPartitions reads the results of queueLockPartitions' statements
// from br, and closes it.
func readLockPartitions(br pgx.BatchResults, consumer string, ids []string) error {
	for _, id := range ids {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("lock consumer %s: %w", ShardID{Consumer: consumer, Instance: id}, err)
		}
	}
	return br.Close()
}

// instances returns the instance ids of ids.
func instances(ids []ShardID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Instance
	}
	return out
}

// liveLockWait bounds how long a switching shadow pass waits for each
// partition's lock: about one batch of a partition's pass.
const liveLockWait = 200 * time.Millisecond

// tryLockLive takes, in tx, the locks of every live shard sh's shadow
// switches in for, and reports whether it holds them all. The unpartitioned
// shard's is tried without waiting (its passes are what the switch waits
// on, retried shortly). A partitioned consumer's are taken in partition
// order, waiting up to liveLockWait for each, inside a savepoint: a
// partition this pass holds cannot be taken again by its own passes, so
// the switch does not need every partition idle at one instant (which
// writers keeping each busy could deny it for long); if one wait times
// out, the rollback to the savepoint releases those taken and the switch
// is retried shortly. Passes take one partition's lock each, and every
// other holder of several takes them in the same order (LockPartitions),
// so the waits cannot deadlock.
func (d *Dispatcher) tryLockLive(ctx context.Context, tx pgx.Tx, sh *shard) (bool, error) {
	ids, err := d.liveShards(ctx, tx, sh)
	if err != nil {
		return false, err
	}
	sh.shadow.live = ids
	if sh.proj.cfg.Partitions <= 1 {
		var locked bool
		if err := tx.QueryRow(ctx, d.sql.tryLock, shardLockKey(d.store.Schema(), ids[0])).Scan(&locked); err != nil {
			return false, fmt.Errorf("shadow pass: lock live shard: %w", err)
		}
		return locked, nil
	}
	var prev string
	if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&prev); err != nil {
		return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
	}
	if _, err := tx.Exec(ctx, `SAVEPOINT projector_live_locks`); err != nil {
		return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, liveLockWait.Milliseconds())); err != nil {
		return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
	}
	if err := LockPartitions(ctx, tx, d.store, sh.id.Consumer, instances(ids)); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" { // lock_not_available
			return false, fmt.Errorf("shadow pass: %w", err)
		}
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_live_locks`); err != nil {
			return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
		}
		return false, nil
	}
	// The partitions read before the locks may have changed meanwhile (a
	// split or merge committed): read them again, now that nothing can
	// change them, and start over if they did.
	again, err := d.liveShards(ctx, tx, sh)
	if err != nil {
		return false, err
	}
	if !slices.Equal(again, ids) {
		if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_live_locks`); err != nil {
			return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
		}
		return false, nil
	}
	if _, err := tx.Exec(ctx, `RELEASE SAVEPOINT projector_live_locks`); err != nil {
		return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, prev); err != nil {
		return false, fmt.Errorf("shadow pass: lock the partitions: %w", err)
	}
	return true, nil
}

// liveFits reports whether the live shards sh's shadow switches in for
// are what its projection expects (partitioned into as many partitions, or
// not partitioned) and none is held for a merge, read under their locks.
// Their cursors may be ahead of the shadow's: the switching pass applies
// the gap and each keeps its own (rebuild_gap.go).
//
// A partition held for a merge (split.go) postpones the switch: the merge
// waits for both halves to stand at their hold, which a switch moving
// their cursors to the shadow's would spoil (the halves would stand
// elsewhere, and the merge would never swap them); the merge finishes (or
// gives up, lifting its holds) and a later pass switches. A merge of
// caught-up halves sets its holds without the partitions' locks
// (mergehold.go), so one may land between this read and the switch: the
// database then refuses the switch's cursor past the hold (holdcheck.go),
// and the switch rolls back to be tried again; a cursor at or before it
// stands, and the halves, at the new version, go on to their hold.
func (d *Dispatcher) liveFits(ctx context.Context, tx pgx.Tx, sh *shard) (bool, error) {
	rows, err := tx.Query(ctx, `SELECT instance_id, version, hold_tx_id IS NOT NULL FROM `+d.store.Table("projector_consumers")+`
		WHERE name = $1 AND (instance_id = '`+SharedInstance+`' OR instance_id LIKE '`+PartitionPrefix+`%')`, sh.id.Consumer)
	if err != nil {
		return false, fmt.Errorf("switch: read the live cursors: %w", err)
	}
	defer rows.Close()
	want := map[string]bool{}
	for _, id := range sh.shadow.live {
		want[id.Instance] = true
	}
	n := sh.proj.cfg.Partitions
	fenced, found, held := false, 0, ""
	for rows.Next() {
		var id string
		var version int
		var isHeld bool
		if err := rows.Scan(&id, &version, &isHeld); err != nil {
			return false, fmt.Errorf("switch: read the live cursors: %w", err)
		}
		if id == SharedInstance && version == PartitionedVersion {
			fenced = true
			if n > 1 {
				continue
			}
		}
		if !want[id] {
			continue // an unpartitioned consumer's leftover partition rows, or the fence
		}
		found++
		if isHeld {
			held = id
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("switch: read the live cursors: %w", err)
	}
	if fenced != (n > 1) || found != len(want) || found == 0 {
		if sh.shadow.misfit {
			return false, nil
		}
		sh.shadow.misfit = true
		d.logger.ErrorContext(ctx, "projection dispatcher: rebuild cannot switch: the live consumer is partitioned differently from this version; declare the live partition count (AsyncConfig.Partitions) in this version, or cancel the rebuild",
			slog.String("consumer", sh.id.Consumer), slog.Int("this_version_partitions", n), slog.Bool("live_partitioned", fenced))
		return false, nil
	}
	if held != "" {
		if !sh.shadow.heldSaid {
			sh.shadow.heldSaid = true
			d.logger.WarnContext(ctx, "projection dispatcher: rebuild waits to switch: a partition is held for a merge under way; the switch follows once the merge finishes (`projector consumer merge` finishes a merge that was interrupted)",
				slog.String("consumer", sh.id.Consumer), slog.String("partition", held))
		}
		return false, nil
	}
	sh.shadow.heldSaid = false
	return true, nil
}

// handOverDeadLetters gives the shadow shard's dead letters to the live
// shard their stream belongs to, whose lock a retry of them takes.
func (d *Dispatcher) handOverDeadLetters(ctx context.Context, tx pgx.Tx, sh *shard) error {
	dl := d.store.Table("projector_dead_letters")
	var err error
	if sh.proj.cfg.Partitions > 1 {
		// To the partition whose segment holds the stream: partition v of
		// n holds the hashes h with h·n >> 32 = v (n a power of two).
		part := `substr(p.instance_id, ` + strconv.Itoa(len(PartitionPrefix)+1) + `)`
		_, err = tx.Exec(ctx, `UPDATE `+dl+` dl SET instance_id = p.instance_id
			FROM (SELECT p.instance_id, split_part(`+part+`, '/', 1)::bigint AS v, split_part(`+part+`, '/', 2)::bigint AS n
				FROM `+d.store.Table("projector_consumers")+` p WHERE p.name = $1 AND p.instance_id = ANY($4)) p
			WHERE dl.consumer = $1 AND dl.instance_id = $2 AND dl.model_rebuild_id = $3
				AND (`+d.store.Table("projector_stream_hash")+`(dl.tenant_id, dl.stream_type, dl.stream_id) * p.n) >> 32 = p.v`,
			sh.id.Consumer, RebuildInstance, sh.shadow.rebuildID, instances(sh.shadow.live))
	} else {
		_, err = tx.Exec(ctx, `UPDATE `+dl+` SET instance_id = $4
			WHERE consumer = $1 AND instance_id = $2 AND model_rebuild_id = $3`, sh.id.Consumer, RebuildInstance, sh.shadow.rebuildID, SharedInstance)
	}
	if err != nil {
		return fmt.Errorf("switch: hand the shadow shard's dead letters to the live shards: %w", err)
	}
	return nil
}

// RebuildShardSQL joins, to a row r of projector_rebuilds, the shard s the
// rebuild runs on (consumers is the qualified projector_consumers): the
// shadow shard blue/green; in place, the shared shard, or the partitions
// of a partitioned consumer, the furthest behind standing for them. s has
// name, cursor_tx_id, cursor_seq and replayed: no shard of it is still
// replaying in place (every partition has passed its replay mark). Used by
// rebuild.List and the rebuild gauges, so both measure the same.
func RebuildShardSQL(consumers string) string {
	return `LEFT JOIN LATERAL (
			SELECT s.name, s.cursor_tx_id, s.cursor_seq, bool_and(s.replay_until_tx_id IS NULL) OVER () AS replayed
			FROM ` + consumers + ` s WHERE s.name = r.name AND CASE WHEN r.mode = 'blue-green' THEN s.instance_id = '` + RebuildInstance + `'
				ELSE (s.instance_id = '` + SharedInstance + `' AND s.version <> ` + strconv.Itoa(PartitionedVersion) + `)
					OR starts_with(s.instance_id, '` + PartitionPrefix + `') END
			ORDER BY s.cursor_tx_id, s.cursor_seq LIMIT 1) s ON true`
}

package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Partitioned consumers (docs/scaling.md, "Partitioned consumers").
//
// A consumer with AsyncConfig.Partitions = N > 1 has N shards, one per hash
// segment of the streams (postgres.Segment): partition p holds the streams
// whose postgres.StreamHash has p in its top log2(N) bits. Each partition is
// a shard like any other — state row, cursor, advisory lock, status,
// attempts, dead letters, metrics — whose instance id is reserved
// (PartitionInstance). A stream lives in one partition, so its events are
// applied in order (promise 4); every partition reads below the same
// horizon (promise 3); the advisory lock keeps one pass per partition at a
// time (promise 6), and the balancing on top (balance.go) only decides which
// process tries which partition.
//
// The consumer's unpartitioned row, (name, SharedInstance), stays as a
// fence: version PartitionedVersion and status disabled. A binary that does
// not know partitions registers that row (ON CONFLICT DO NOTHING: it finds
// the fence), reads a version that is not its own and stands aside as it
// does for a newer model version; retention passes over it (disabled).

// PartitionPrefix starts the reserved instance id of a partition's shard:
// PartitionPrefix + "p/N".
const PartitionPrefix = "__partition__"

// PartitionedVersion is the model version recorded on a partitioned
// consumer's unpartitioned row: no projection has it, so a dispatcher that
// would run the consumer unpartitioned (an older binary, or one declaring
// no partitions) stands aside instead of applying events twice.
const PartitionedVersion = math.MaxInt32

// ErrPartitionsChanged is returned by [Dispatcher.Start] when a consumer's
// declared partition count differs from the partitions it has: changing the
// count is not a silent reshuffle (splitting and merging are not built
// yet; see docs/scaling.md).
var ErrPartitionsChanged = errors.New("projection dispatcher: partition count changed")

// PartitionInstance returns the instance id of partition p of n.
func PartitionInstance(p, n int) string {
	return PartitionPrefix + strconv.Itoa(p) + "/" + strconv.Itoa(n)
}

// ParsePartition returns the partition and count of a partition shard's
// instance id; ok is false for any other instance id.
func ParsePartition(instance string) (p, n int, ok bool) {
	rest, found := strings.CutPrefix(instance, PartitionPrefix)
	if !found {
		return 0, 0, false
	}
	ps, ns, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(ps)
	n, err2 := strconv.Atoi(ns)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	if _, err := postgres.SegmentOf(p, n); err != nil {
		return 0, 0, false
	}
	return p, n, true
}

// validPartitions checks AsyncConfig.Partitions.
func validPartitions(cfg AsyncConfig) error {
	switch n := cfg.Partitions; {
	case n < 0 || n > postgres.MaxPartitions || (n > 1 && n&(n-1) != 0):
		return fmt.Errorf("partitions %d: want 0 or 1 (unpartitioned) or a power of two up to %d", n, postgres.MaxPartitions)
	case n > 1 && cfg.Delivery == PerInstance:
		return errors.New("partitions with per-instance delivery: every process applies every event of a per-instance consumer; partition a shared one")
	}
	return nil
}

// partitionSQL is what registration and balancing write about partitions.
type partitionSQL struct {
	fenceRow, fence, insertFence, partitions, insertPartition string
}

func buildPartitionSQL(store *postgres.Store) partitionSQL {
	c := store.Table("projector_consumers")
	return partitionSQL{
		fenceRow: `SELECT version, cursor_tx_id, cursor_seq FROM ` + c + ` WHERE name = $1 AND instance_id = '` + SharedInstance + `' FOR UPDATE`,
		fence: `UPDATE ` + c + ` SET version = ` + strconv.Itoa(PartitionedVersion) + `, status = 'disabled', attempts = 0,
				last_error = $2, last_error_at = NULL, failed_tx_id = NULL, failed_seq = NULL, failed_event_id = NULL,
				next_retry_at = NULL, updated_at = now()
			WHERE name = $1 AND instance_id = '` + SharedInstance + `'`,
		insertFence: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, version, status, last_error)
			VALUES ($1, '` + SharedInstance + `', $2, $3, ` + strconv.Itoa(PartitionedVersion) + `, 'disabled', $4)
			ON CONFLICT (name, instance_id) DO NOTHING`,
		partitions:      `SELECT instance_id FROM ` + c + ` WHERE name = $1 AND instance_id LIKE '` + PartitionPrefix + `%'`,
		insertPartition: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, version) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name, instance_id) DO NOTHING`,
	}
}

// fenceNote is what the fence row's last_error says, for an operator
// reading it with a binary that does not know partitions.
func fenceNote(n int) string {
	return fmt.Sprintf("partitioned into %d partitions (shards %s…%s); this row only fences binaries that do not know partitions", n, PartitionInstance(0, n), PartitionInstance(n-1, n))
}

// registerPartitioned registers the shards of partitioned projection p in
// tx: under the unpartitioned shard's lock (waiting for a pass of an older
// binary to end), it creates the fence and the partitions, each partition
// starting where the unpartitioned consumer stood (it had applied every
// event of every partition up to there), or at start for a new consumer.
func (d *Dispatcher) registerPartitioned(ctx context.Context, tx pgx.Tx, p *Async, start projector.Position) error {
	n := p.cfg.Partitions
	unpartitioned := ShardID{Consumer: p.name, Instance: SharedInstance}
	if _, err := tx.Exec(ctx, d.sql.waitLock, shardLockKey(d.store.Schema(), unpartitioned)); err != nil {
		return err
	}
	var version int
	var cursor projector.Position
	err := tx.QueryRow(ctx, d.psql.fenceRow, p.name).Scan(&version, &cursor.TxID, &cursor.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		tag, ierr := tx.Exec(ctx, d.psql.insertFence, p.name, start.TxID, start.Seq, keyedNote(p, fenceNote(n)))
		if ierr != nil {
			return ierr
		}
		if tag.RowsAffected() == 1 {
			version, cursor, err = PartitionedVersion, start, nil
		} else {
			// A binary that does not know partitions registered the
			// unpartitioned row meanwhile (its insert takes no advisory
			// lock; ours waited for its commit): read it again, now
			// committed, and convert it like any unpartitioned consumer.
			err = tx.QueryRow(ctx, d.psql.fenceRow, p.name).Scan(&version, &cursor.TxID, &cursor.Seq)
		}
	}
	switch {
	case err != nil:
		return err
	case version == PartitionedVersion:
		rows, err := tx.Query(ctx, d.psql.partitions, p.name)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, have, ok := ParsePartition(id); ok && have != n {
				return fmt.Errorf("%w: consumer %s has %d partitions, this projection declares %d; splitting and merging are not built yet: declare %d again, or remove the consumer (projector consumer remove %s) and let it start over",
					ErrPartitionsChanged, p.name, have, n, have, p.name)
			}
		}
		cursor = start // a partition row an operator removed starts over, as an unpartitioned one does
	case version != p.cfg.Version:
		return fmt.Errorf("consumer %s is at model version %d and this projection is version %d: partition it once the versions agree (finish or cancel the rebuild)", p.name, version, p.cfg.Version)
	default:
		// An unpartitioned consumer becomes partitioned: its partitions
		// inherit its cursor, and its row becomes the fence.
		if _, err := tx.Exec(ctx, d.psql.fence, p.name, keyedNote(p, fenceNote(n))); err != nil {
			return err
		}
		d.logger.InfoContext(ctx, "projection dispatcher: consumer partitioned; its partitions start at its cursor",
			slog.String("consumer", p.name), slog.Int("partitions", n), slog.String("cursor", cursor.String()))
	}
	for i := range n {
		if _, err := tx.Exec(ctx, d.psql.insertPartition, p.name, PartitionInstance(i, n), cursor.TxID, cursor.Seq, p.cfg.Version); err != nil {
			return err
		}
	}
	return nil
}

package postgres

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ImportWorkers is Import with workers goroutines decoding each batch,
// whatever GOMAXPROCS is: the tests of the parallel decoding's error order.
func (s *Store) ImportWorkers(ctx context.Context, r io.Reader, opts ImportOptions, workers int) (ImportResult, error) {
	return s.importWith(ctx, r, opts, workers)
}

// PositionColumns lets the external tests compare the repair's list of
// stored transaction ids with the schema's xid8 columns.
var PositionColumns = positionColumns

// ExplainReadLog runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) on the statement
// ReadLog sends for q, for tests of what a read costs, under the planner
// settings ReadLog runs it with.
func (s *Store) ExplainReadLog(ctx context.Context, q LogQuery) ([]byte, error) {
	sql, args, merged := s.readLogQuery(q, q.Limit)
	var plan []byte
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if merged {
			if _, err := tx.Exec(ctx, mergedPlanSetSQL); err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&plan)
	})
	return plan, err
}

// ExplainPruneLocked returns the plans (EXPLAIN FORMAT JSON) of the
// statements a prune of types before cutoff runs on the events table while
// it holds the consumers table in SHARE mode, unguarded (the batch chosen
// as Prune chooses it, beforehand), in a transaction it rolls back.
func (s *Store) ExplainPruneLocked(ctx context.Context, types []string, cutoff time.Time, batch int) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.sql.pruneChoose, types, cutoff, batch)
	if err != nil {
		return nil, err
	}
	var txs []string
	var seqs []int64
	var ats []time.Time
	var tx string
	var seq int64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&tx, &seq, &at}, func() error {
		txs, seqs, ats = append(txs, tx), append(seqs, seq), append(ats, at)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(txs) == 0 {
		return nil, errors.New("nothing to prune")
	}
	oldest, newest := slices.MinFunc(ats, time.Time.Compare), slices.MaxFunc(ats, time.Time.Compare)
	halt := strings.NewReplacer("{{c}}", s.Table("projector_consumers"), "{{i}}", s.Table("projector_instances"),
		"{{e}}", s.Table("projector_events"), "{{d}}", s.Table("projector_dead_letters"),
		"{{pe}}", s.Table("projector_parked_events"), "{{lockPrefix}}", "$6").Replace(haltExpiredFixedSQL)
	var plans []string
	err = pgx.BeginFunc(ctx, s.pool, func(dbtx pgx.Tx) error {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{s.sql.pruneDelete, []any{types, oldest, newest, cutoff, txs[0], seqs[0], txs[len(txs)-1], seqs[len(seqs)-1], uint64(0), int64(0), true}},
			{halt, []any{types, cutoff, uint64(0), int64(0), true, shardLockPrefix(s.schema)}},
		} {
			var plan string
			if err := dbtx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q.sql, q.args...).Scan(&plan); err != nil {
				return err
			}
			plans = append(plans, plan)
		}
		return errRollback
	})
	if err != nil && err != errRollback {
		return nil, err
	}
	return plans, nil
}

var errRollback = errors.New("rolled back")

// SetRewrapHook sets the hook a rewrap batch runs between its read of the
// key rows and its update of them (batch counts from 1).
func (k *KeyTable) SetRewrapHook(hook func(ctx context.Context, batch int) error) {
	k.rewrapHook = hook
}

// StreamReadSQL is the statement and arguments ReadStream sends for a
// whole stream, for benchmarks that time the read without the opening and
// decoding of its rows.
func (s *Store) StreamReadSQL(stream projector.StreamRef) (string, []any) {
	mode, keyArgs := s.readKeys()
	args := append([]any{stream.Tenant, stream.Type, stream.ID, int64(1), int64(math.MaxInt64), (*time.Time)(nil)}, keyArgs...)
	return s.sql.read[mode].stream, args
}

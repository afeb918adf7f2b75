package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ErrNoStreamTypes: a prune named no stream types and the store declares
// none ephemeral. Prune never guesses: aggregate streams are history.
var ErrNoStreamTypes = errors.New("projector: prune needs stream types (name them, or declare Config.Ephemeral)")

// ErrAggregateHistory: a prune named a stream type the store does not
// declare ephemeral without [PruneOptions.IncludeAggregates]. Such streams
// are aggregate history: deleting their old events leaves streams that fold
// from the middle, so it must be asked for explicitly.
var ErrAggregateHistory = errors.New("projector: prune would delete aggregate history")

// ErrInvalidPrune: a prune's options are out of range (a non-positive age or
// batch size, or an age that puts the cutoff before year 1).
var ErrInvalidPrune = errors.New("projector: invalid prune options")

// MaxPruneBatchSize bounds [PruneOptions.BatchSize]: each delete transaction
// holds the consumers table in SHARE mode, so dispatchers wait for it.
const MaxPruneBatchSize = 1_000_000

// PruneOptions says what to prune.
type PruneOptions struct {
	// OlderThan is the minimum age, by the database clock, of an event to
	// delete. Required.
	OlderThan time.Duration
	// StreamTypes are the stream types to prune; default the store's
	// Config.Ephemeral. Streams of other types are never touched.
	StreamTypes []string
	// IncludeAggregates lets StreamTypes name types the store does not
	// declare ephemeral (Config.Ephemeral): aggregate history. Without it
	// such a prune fails with [ErrAggregateHistory] and deletes nothing.
	IncludeAggregates bool
	// DryRun counts what would be deleted and what is held back, and
	// deletes nothing; PruneResult.Types says what per stream type.
	DryRun bool
	// BatchSize is how many events one delete transaction removes; default
	// 10,000. Each transaction holds the consumers table in SHARE mode
	// (dispatchers wait to write their cursors), so keep it modest.
	BatchSize int
}

// PruneResult reports a prune.
type PruneResult struct {
	// Cutoff is the database time events had to be older than.
	Cutoff time.Time
	// Deleted counts deleted events (would-be deleted, in a dry run).
	Deleted int64
	// HeldBack counts events old enough to delete that were kept because a
	// consumer shard had not passed them yet.
	HeldBack int64
	// Blocker is the furthest-behind shard that is not disabled, when it
	// held events back.
	Blocker *PruneBlocker
	// Types breaks a dry run's Deleted down by stream type, so an operator
	// sees what would go before it goes; empty after a real prune.
	Types []PruneTypeCount
}

// PruneTypeCount is what a dry run would delete of one stream type.
type PruneTypeCount struct {
	StreamType string
	// Ephemeral reports whether the store declares the type ephemeral;
	// false means aggregate history.
	Ephemeral bool
	// Events and Streams count the events that would be deleted and the
	// streams they belong to.
	Events, Streams int64
}

// PruneBlocker names the consumer shard that holds a prune back.
type PruneBlocker struct {
	Consumer, Instance, Status string
	Cursor                     projector.Position
	// Behind counts the events after its cursor.
	Behind int64
}

// Prune deletes events of the given (or ephemeral) stream types older than
// the cutoff, but never one that some consumer shard that is not disabled
// has not passed (promise 9), and never one recorded in the dead-letter
// table. Each delete transaction locks the consumers table in SHARE mode
// before reading the slowest cursor, so a consumer registering at that
// moment either is seen or waits for the delete to commit.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (PruneResult, error) {
	if opts.OlderThan <= 0 {
		return PruneResult{}, fmt.Errorf("%w: the age must be positive, got %v", ErrInvalidPrune, opts.OlderThan)
	}
	if opts.BatchSize < 0 || opts.BatchSize > MaxPruneBatchSize {
		return PruneResult{}, fmt.Errorf("%w: the batch size must be between 1 and %d, got %d", ErrInvalidPrune, MaxPruneBatchSize, opts.BatchSize)
	}
	types := opts.StreamTypes
	if len(types) == 0 {
		types = s.ephemeral
	}
	if len(types) == 0 {
		return PruneResult{}, ErrNoStreamTypes
	}
	if !opts.IncludeAggregates {
		if history := s.notEphemeral(types); len(history) > 0 {
			return PruneResult{}, fmt.Errorf("%w: stream types %v are not declared ephemeral", ErrAggregateHistory, history)
		}
	}
	batch := cmp.Or(opts.BatchSize, 10_000)
	var res PruneResult
	// A cutoff before year 1 is out of what the application and the log
	// can mean; refuse it rather than let the date arithmetic wrap.
	var inRange bool
	if err := s.pool.QueryRow(ctx, `SELECT now() - make_interval(secs => $1), now() - make_interval(secs => $1) >= '0001-01-01 00:00:00+00'::timestamptz`,
		opts.OlderThan.Seconds()).Scan(&res.Cutoff, &inRange); err != nil {
		return res, fmt.Errorf("prune: read database clock: %w", err)
	}
	if !inRange {
		return PruneResult{}, fmt.Errorf("%w: an age of %v puts the cutoff before year 1", ErrInvalidPrune, opts.OlderThan)
	}
	for {
		var n int64
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE `+s.Table("projector_consumers")+` IN SHARE MODE`); err != nil {
				return fmt.Errorf("lock consumers: %w", err)
			}
			guard, blocker, err := s.slowestShard(ctx, tx)
			if err != nil {
				return err
			}
			if opts.DryRun {
				err := tx.QueryRow(ctx, s.sql.pruneCount, types, res.Cutoff, guard.TxID, guard.Seq, blocker == nil).Scan(&res.Deleted, &res.HeldBack)
				if err != nil {
					return fmt.Errorf("count: %w", err)
				}
				res.Blocker = blocker
				return s.pruneTypes(ctx, tx, types, res.Cutoff, guard, blocker == nil, &res)
			}
			tag, err := tx.Exec(ctx, s.sql.pruneDelete, types, res.Cutoff, guard.TxID, guard.Seq, blocker == nil, batch)
			if err != nil {
				return fmt.Errorf("delete: %w", err)
			}
			n = tag.RowsAffected()
			res.Deleted += n
			if n < int64(batch) { // the last round: count what the guard kept
				var wouldDelete int64
				if err := tx.QueryRow(ctx, s.sql.pruneCount, types, res.Cutoff, guard.TxID, guard.Seq, blocker == nil).Scan(&wouldDelete, &res.HeldBack); err != nil {
					return fmt.Errorf("count held back: %w", err)
				}
				res.Blocker = blocker
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("prune %v older than %s: %w", types, res.Cutoff.Format(time.RFC3339), err)
		}
		if opts.DryRun || n < int64(batch) {
			break
		}
	}
	if res.HeldBack == 0 {
		res.Blocker = nil
	}
	if res.Blocker != nil {
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Table("projector_events")+` e WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint)`,
			res.Blocker.Cursor.TxID, res.Blocker.Cursor.Seq).Scan(&res.Blocker.Behind); err != nil {
			return res, fmt.Errorf("prune: measure lag of %s: %w", res.Blocker.Consumer, err)
		}
	}
	return res, nil
}

// slowestShard returns the lowest cursor among shards that are not
// disabled, and that shard; none means no consumer holds anything back.
func (s *Store) slowestShard(ctx context.Context, tx pgx.Tx) (projector.Position, *PruneBlocker, error) {
	var b PruneBlocker
	err := tx.QueryRow(ctx, `SELECT name, instance_id, status, cursor_tx_id, cursor_seq FROM `+s.Table("projector_consumers")+`
		WHERE status <> 'disabled' ORDER BY cursor_tx_id, cursor_seq LIMIT 1`).Scan(&b.Consumer, &b.Instance, &b.Status, &b.Cursor.TxID, &b.Cursor.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return projector.Position{}, nil, nil
	}
	if err != nil {
		return projector.Position{}, nil, fmt.Errorf("read slowest consumer: %w", err)
	}
	return b.Cursor, &b, nil
}

// notEphemeral returns the types the store does not declare ephemeral.
func (s *Store) notEphemeral(types []string) []string {
	var out []string
	for _, t := range types {
		if !slices.Contains(s.ephemeral, t) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// pruneTypes fills a dry run's per-type breakdown.
func (s *Store) pruneTypes(ctx context.Context, tx pgx.Tx, types []string, cutoff time.Time, guard projector.Position, unguarded bool, res *PruneResult) error {
	// Not a hot path: the schema is filled in here rather than kept in
	// the store's statements.
	q := strings.NewReplacer("{{s}}.projector_events", s.Table("projector_events"),
		"{{s}}.projector_dead_letters", s.Table("projector_dead_letters")).Replace(pruneByTypeSQL)
	rows, err := tx.Query(ctx, q, types, cutoff, guard.TxID, guard.Seq, unguarded)
	if err != nil {
		return fmt.Errorf("count by stream type: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PruneTypeCount, error) {
		var c PruneTypeCount
		err := row.Scan(&c.StreamType, &c.Events, &c.Streams)
		c.Ephemeral = slices.Contains(s.ephemeral, c.StreamType)
		return c, err
	})
	if err != nil {
		return fmt.Errorf("count by stream type: %w", err)
	}
	res.Types = counts
	return nil
}

// Ephemeral returns the stream types the store was told may be pruned by
// default.
func (s *Store) Ephemeral() []string { return append([]string(nil), s.ephemeral...) }

const pruneCandidates = `
	FROM {{s}}.projector_events e
	WHERE e.stream_type = ANY($1::text[]) AND e.recorded_at < $2
	  AND NOT EXISTS (SELECT 1 FROM {{s}}.projector_dead_letters d WHERE d.event_id = e.id)`

// pruneCountSQL counts the candidates the guard lets go and those it keeps.
const pruneCountSQL = `SELECT
	count(*) FILTER (WHERE $5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint)),
	count(*) FILTER (WHERE NOT $5::bool AND (e.tx_id, e.seq) > ($3::xid8, $4::bigint))` + pruneCandidates

// pruneByTypeSQL breaks the candidates the guard lets go down by stream
// type, for a dry run.
const pruneByTypeSQL = `SELECT e.stream_type, count(*), count(DISTINCT (e.tenant_id, e.stream_id))` + pruneCandidates + `
	  AND ($5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint))
	GROUP BY e.stream_type ORDER BY e.stream_type`

// pruneDeleteSQL deletes one batch, oldest first along the log's own index.
const pruneDeleteSQL = `DELETE FROM {{s}}.projector_events WHERE (tx_id, seq) IN (
	SELECT e.tx_id, e.seq` + pruneCandidates + `
	  AND ($5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint))
	ORDER BY e.tx_id, e.seq LIMIT $6)`

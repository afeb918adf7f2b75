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
	// Dispatcher is "live" when a dispatcher running the shard has a recent
	// heartbeat, else "none": the shard is unattended, and waiting will not
	// help. (Stale per-instance shards never block; see Prune.)
	Dispatcher string
}

// Prune deletes events of the given (or ephemeral) stream types older than
// the cutoff, but never one that some consumer shard that is not disabled
// has not passed (promise 9), and never the event of an open dead letter
// (one that may still be retried) or of an open park (projection.ParkStream:
// the cursor passed it, the park holds it for a retry); once every dead
// letter of an event is resolved or discarded and its park resolved or
// discarded, the event is pruned like any other. Each delete
// transaction locks the consumers table in SHARE mode before reading the
// slowest cursor, so a consumer registering (or a rebuild rewinding) at
// that moment either is seen or waits for the delete to commit. The rows
// of a batch are chosen before the lock, along an index on the prune's
// filter, and found again and deleted under it through the batch's spans
// of times and positions: how long dispatchers wait for a prune depends on
// the batch size, not on the size of the log. A dry run takes no lock.
//
// A per-instance shard whose instance has not been seen for its expiry
// (projector_instances, written by dispatcher heartbeats) is stale and does
// not hold retention back. Unless DryRun, the prune also removes the stale
// shards of random instance ids (no process can resume them), and halts
// (marks dead, saying why) a stale shard of a fixed id whose unapplied
// events it is about to delete, so that instance, if it returns, stops
// loudly instead of resuming over the gap.
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
	for _, t := range types {
		// Checked here, so a stream type no stream can have is a clear
		// error rather than a raw one from the driver.
		if err := projector.Stream(t, "-").Validate(); err != nil {
			return PruneResult{}, fmt.Errorf("%w: stream type %s cannot exist: %w", ErrInvalidPrune, projector.Printable(t), err)
		}
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
	if opts.DryRun {
		if err := s.pruneDryRun(ctx, types, &res); err != nil {
			return res, fmt.Errorf("prune %v older than %s: %w", types, res.Cutoff.Format(time.RFC3339), err)
		}
	} else if err := s.pruneBatches(ctx, types, batch, &res); err != nil {
		return res, fmt.Errorf("prune %v older than %s: %w", types, res.Cutoff.Format(time.RFC3339), err)
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

// pruneBatches deletes in batches. Each batch's rows are chosen first,
// without a lock, along the (stream_type, recorded_at) index: the oldest
// candidates in log order, up to batch. Only then does a transaction lock
// the consumers table in SHARE mode, read the guard (slowestShard) and
// delete again those of the chosen rows the guard lets go, found through
// the batch's spans of times and positions: what the lock is held for
// depends on the batch, not on the log. A consumer that registers or
// rewinds between the choice and the lock is seen by the guard, which is
// read under the lock, so promise 9 is kept exactly; the choice can only
// be too generous, never let an event go that the guard keeps. What the
// guard held back is counted after the lock is released.
func (s *Store) pruneBatches(ctx context.Context, types []string, batch int, res *PruneResult) error {
	var guard projector.Position
	var blocker *PruneBlocker
	for {
		rows, err := s.pool.Query(ctx, s.sql.pruneChoose, types, res.Cutoff, batch)
		if err != nil {
			return fmt.Errorf("choose: %w", err)
		}
		// The batch as the locked delete finds it again: its first and
		// last positions and the span of its recording times.
		var chosen int
		var first, last, pos struct {
			tx  string
			seq int64
		}
		var oldest, newest, at time.Time
		if _, err := pgx.ForEachRow(rows, []any{&pos.tx, &pos.seq, &at}, func() error {
			if chosen == 0 {
				first, oldest, newest = pos, at, at
			}
			last, oldest, newest = pos, minTime(oldest, at), maxTime(newest, at)
			chosen++
			return nil
		}); err != nil {
			return fmt.Errorf("choose: %w", err)
		}
		var n int64
		// The locked round runs even with nothing chosen: it is also where
		// stale shards are removed or halted, and where the guard is read.
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `LOCK TABLE `+s.Table("projector_consumers")+` IN SHARE MODE`); err != nil {
				return fmt.Errorf("lock consumers: %w", err)
			}
			var err error
			if guard, blocker, err = s.slowestShard(ctx, tx, types, res.Cutoff, false); err != nil {
				return err
			}
			if chosen == 0 {
				return nil
			}
			if err := tx.QueryRow(ctx, s.sql.pruneDelete, types, oldest, newest, res.Cutoff, first.tx, first.seq, last.tx, last.seq,
				guard.TxID, guard.Seq, blocker == nil).Scan(&n); err != nil {
				return fmt.Errorf("delete: %w", err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		res.Deleted += n
		// The last round: fewer candidates than a batch are left, or the
		// guard (or a dead letter opened since the choice) kept some of
		// them, and the next choice would start with those. (A late
		// commit inside the batch's span may add to n: also fine.)
		if chosen < batch || n < int64(chosen) {
			break
		}
	}
	var wouldDelete int64
	if err := s.pool.QueryRow(ctx, s.sql.pruneCount, types, res.Cutoff, guard.TxID, guard.Seq, blocker == nil).Scan(&wouldDelete, &res.HeldBack); err != nil {
		return fmt.Errorf("count held back: %w", err)
	}
	res.Blocker = blocker
	return nil
}

// pruneDryRun counts what a prune would delete and what the guard would
// hold back, deleting nothing. It takes no SHARE lock (it writes nothing a
// registering consumer could race with), so it never stalls dispatchers;
// one repeatable-read snapshot keeps its counts consistent with its guard.
func (s *Store) pruneDryRun(ctx context.Context, types []string, res *PruneResult) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		guard, blocker, err := s.slowestShard(ctx, tx, types, res.Cutoff, true)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, s.sql.pruneCount, types, res.Cutoff, guard.TxID, guard.Seq, blocker == nil).Scan(&res.Deleted, &res.HeldBack); err != nil {
			return fmt.Errorf("count: %w", err)
		}
		res.Blocker = blocker
		return s.pruneTypes(ctx, tx, types, res.Cutoff, guard, blocker == nil, res)
	})
}

// slowestShard returns the lowest cursor among shards that are neither
// disabled nor stale, and that shard; none means no consumer holds anything
// back. Unless dryRun it first removes the stale shards of random instance
// ids, and then halts the stale fixed-id shards whose events a prune of
// types before cutoff under that guard would delete (see Prune).
func (s *Store) slowestShard(ctx context.Context, tx pgx.Tx, types []string, cutoff time.Time, dryRun bool) (projector.Position, *PruneBlocker, error) {
	fill := func(sql string) string {
		return strings.NewReplacer("{{c}}", s.Table("projector_consumers"), "{{i}}", s.Table("projector_instances"),
			"{{e}}", s.Table("projector_events"), "{{d}}", s.Table("projector_dead_letters"),
			"{{pe}}", s.Table("projector_parked_events")).Replace(sql)
	}
	if !dryRun {
		if _, err := tx.Exec(ctx, fill(removeExpiredRandomSQL)); err != nil {
			return projector.Position{}, nil, fmt.Errorf("remove expired shards of random instance ids: %w", err)
		}
	}
	var b PruneBlocker
	guard := projector.Position{}
	lockPrefix := shardLockPrefix(s.schema)
	err := tx.QueryRow(ctx, strings.ReplaceAll(fill(slowestShardSQL), "{{lockPrefix}}", "$1"), lockPrefix).Scan(&b.Consumer, &b.Instance, &b.Status, &b.Cursor.TxID, &b.Cursor.Seq, &b.Dispatcher)
	found := err == nil
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return projector.Position{}, nil, fmt.Errorf("read slowest consumer: %w", err)
	default:
		guard = b.Cursor
	}
	if !dryRun {
		if _, err := tx.Exec(ctx, strings.ReplaceAll(fill(haltExpiredFixedSQL), "{{lockPrefix}}", "$6"), types, cutoff, guard.TxID, guard.Seq, !found, lockPrefix); err != nil {
			return projector.Position{}, nil, fmt.Errorf("halt expired shards pruned past: %w", err)
		}
	}
	if !found {
		return projector.Position{}, nil, nil
	}
	return guard, &b, nil
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
		"{{s}}.projector_dead_letters", s.Table("projector_dead_letters"),
		"{{s}}.projector_parked_events", s.Table("projector_parked_events")).Replace(pruneByTypeSQL)
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

// expiredInstance holds for an instance row i not seen for its expiry.
const expiredInstance = `i.last_seen_at < now() - i.expire_after`

// shardLockPrefix is the start of the key of a shard's advisory lock in
// schema, as package projection builds it (shardLockKey): the prefix, then
// consumer, a unit separator and instance id.
func shardLockPrefix(schema string) string { return "projector.shard\x1f" + schema + "\x1f" }

// tryShardLock takes the advisory lock of shard c for the prune's
// transaction (re-entrant: true again if this transaction holds it), with
// the key prefix in the parameter the statement puts in {{lockPrefix}}. An
// expired shard is only passed over while prune holds its lock: a pass
// running on it (its instance alive after all) keeps it in the guard, and
// no pass can start on it until the prune batch, and any halt it writes,
// has committed. An operator transition waits for the lock before it locks
// the row, so it cannot deadlock with a halt.
const tryShardLock = `pg_try_advisory_xact_lock(hashtextextended({{lockPrefix}}::text || c.name || chr(31) || c.instance_id, 0))`

// removeExpiredRandomSQL removes expired random instance ids and their
// per-instance shards: a SIGKILLed process with a random id left them, and
// no process can ever resume them. Dead letters are kept.
const removeExpiredRandomSQL = `WITH gone AS (
	DELETE FROM {{i}} i WHERE i.random_id AND ` + expiredInstance + ` RETURNING i.instance_id)
DELETE FROM {{c}} c USING gone g WHERE c.instance_id = g.instance_id AND c.instance_id <> '__shared__'`

// slowestShardSQL reads the retention guard: the lowest cursor of the
// shards that are neither disabled nor stale (a per-instance shard whose
// instance is expired, and whose lock this transaction could take), with
// whether a live dispatcher runs it (a heartbeat within three intervals,
// projection.LiveHeartbeats). The CASE keeps the lock attempt to expired
// shards: a live one is never locked by a prune.
const slowestShardSQL = `SELECT c.name, c.instance_id, c.status, c.cursor_tx_id, c.cursor_seq,
	CASE WHEN EXISTS (SELECT 1 FROM {{i}} i WHERE c.name = ANY(i.consumers)
		AND (c.instance_id = '__shared__' OR c.instance_id LIKE '__partition__%' OR i.instance_id = c.instance_id)
		AND i.stopped_at IS NULL AND i.last_seen_at > now() - 3 * i.heartbeat_every) THEN 'live' ELSE 'none' END
FROM {{c}} c
WHERE c.status <> 'disabled'
  AND NOT CASE WHEN c.instance_id <> '__shared__' AND EXISTS (SELECT 1 FROM {{i}} i WHERE i.instance_id = c.instance_id AND ` + expiredInstance + `)
	THEN ` + tryShardLock + ` ELSE false END
ORDER BY c.cursor_tx_id, c.cursor_seq LIMIT 1`

// haltExpiredFixedSQL marks dead the expired fixed-id shards that have a
// prune candidate (types $1, before $2, passed by the guard $3/$4, or any
// when $5 says there is no guard) after their cursor: the prune is about to
// delete events they never applied. Marked once; the error says what to do.
const haltExpiredFixedSQL = `UPDATE {{c}} c SET status = 'dead', next_retry_at = NULL, last_error_at = now(), updated_at = now(),
	last_error = format('events after its cursor were pruned while instance %s was away (last seen %s, expiry %s); '
		'resuming would skip them. Restart it to resume past the gap, or remove the shard (consumer remove --instance %s) '
		'so it registers afresh', c.instance_id, to_char(i.last_seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), i.expire_after, c.instance_id)
FROM {{i}} i
WHERE i.instance_id = c.instance_id AND c.instance_id <> '__shared__' AND NOT i.random_id AND ` + expiredInstance + `
  AND c.status <> 'disabled' AND coalesce(c.last_error, '') NOT LIKE 'events after its cursor were pruned%'
  AND EXISTS (SELECT 1 FROM {{e}} e
	WHERE e.stream_type = ANY($1::text[]) AND e.recorded_at < $2
	  AND (e.tx_id, e.seq) > (c.cursor_tx_id, c.cursor_seq)
	  AND ($5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint))
	  AND NOT EXISTS (SELECT 1 FROM {{d}} d WHERE d.event_id = e.id AND d.status = 'open')
	  AND NOT EXISTS (SELECT 1 FROM {{pe}} pk WHERE pk.event_id = e.id))
  AND CASE WHEN ` + expiredInstance + ` THEN ` + tryShardLock + ` ELSE false END`

// Ephemeral returns the stream types the store was told may be pruned by
// default.
func (s *Store) Ephemeral() []string { return append([]string(nil), s.ephemeral...) }

const pruneCandidates = `
	FROM {{s}}.projector_events e
	WHERE e.stream_type = ANY($1::text[]) AND e.recorded_at < $2
	  AND NOT EXISTS (SELECT 1 FROM {{s}}.projector_dead_letters d WHERE d.event_id = e.id AND d.status = 'open')
	  AND NOT EXISTS (SELECT 1 FROM {{s}}.projector_parked_events pk WHERE pk.event_id = e.id)`

// pruneCountSQL counts the candidates the guard lets go and those it keeps.
const pruneCountSQL = `SELECT
	count(*) FILTER (WHERE $5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint)),
	count(*) FILTER (WHERE NOT $5::bool AND (e.tx_id, e.seq) > ($3::xid8, $4::bigint))` + pruneCandidates

// pruneByTypeSQL breaks the candidates the guard lets go down by stream
// type, for a dry run.
const pruneByTypeSQL = `SELECT e.stream_type, count(*), count(DISTINCT (e.tenant_id, e.stream_id))` + pruneCandidates + `
	  AND ($5::bool OR (e.tx_id, e.seq) <= ($3::xid8, $4::bigint))
	GROUP BY e.stream_type ORDER BY e.stream_type`

// pruneChooseSQL picks the next batch of candidates ($1 types, older than
// $2, at most $3), oldest first in log order, without a lock and without
// the guard (which is read under the lock, by pruneDeleteSQL's caller), and
// returns each one's position and recording time. It reads the candidates
// along projector_events_prune, not the log; the transaction id goes out
// as text, as pruneDeleteSQL takes it back.
const pruneChooseSQL = `SELECT e.tx_id::text, e.seq, e.recorded_at` + pruneCandidates + `
	ORDER BY e.tx_id, e.seq LIMIT $3`

// pruneDeleteSQL deletes a chosen batch again, under the lock: the
// candidates ($1 types, older than $4) recorded within the batch's span of
// times ($2..$3) and positioned within its span of the log ($5/$6..$7/$8),
// that the guard read under the lock lets go ($9/$10, or any when $11 says
// there is none) and that no open dead letter or park holds (one may have opened
// since the choice); and it records, per event type, that events of it
// were deleted: a rebuild of a projection reading that type could no
// longer be exact, and is refused. The two spans make it an index range
// scan of about the batch (projector_events_prune on the times, or the
// primary key on the positions), whatever the size of the log. A row in
// both spans that was not chosen (a transaction that committed after the
// choice) is a candidate all the same, and is checked like the others.
const pruneDeleteSQL = `WITH deleted AS (
	DELETE FROM {{s}}.projector_events e
	WHERE e.stream_type = ANY($1::text[]) AND e.recorded_at >= $2 AND e.recorded_at <= $3 AND e.recorded_at < $4
	  AND (e.tx_id, e.seq) >= ($5::text::xid8, $6::bigint) AND (e.tx_id, e.seq) <= ($7::text::xid8, $8::bigint)
	  AND ($11::bool OR (e.tx_id, e.seq) <= ($9::xid8, $10::bigint))
	  AND NOT EXISTS (SELECT 1 FROM {{s}}.projector_dead_letters d WHERE d.event_id = e.id AND d.status = 'open')
	  AND NOT EXISTS (SELECT 1 FROM {{s}}.projector_parked_events pk WHERE pk.event_id = e.id)
	RETURNING e.type
), recorded AS (
	INSERT INTO {{s}}.projector_pruned AS p (event_type, deleted)
	SELECT type, count(*) FROM deleted GROUP BY type
	ON CONFLICT (event_type) DO UPDATE SET deleted = p.deleted + excluded.deleted, last_at = now()
)
SELECT count(*) FROM deleted`

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
)

// ErrStreamArchived: the stream was archived (`projector streams archive`,
// [Store.Archive]). Appending to it is refused, and reading it without
// [StreamQuery.IncludeArchived] fails rather than reading as empty: an
// empty read would let a command treat a closed stream as a new one.
// `projector streams unarchive` ([Store.Unarchive]) makes it live again.
var ErrStreamArchived = errors.New("projector: stream is archived")

// ErrInvalidArchive: an archive or unarchive's options are out of range or
// contradict each other.
var ErrInvalidArchive = errors.New("projector: invalid archive options")

// ErrUnarchiveConflict: an archived event's id is also in the hot log, in
// another stream (a row written around Projector: its appends and imports
// check the archive), so the stream cannot move back; nothing was moved.
// The error names the id.
var ErrUnarchiveConflict = errors.New("projector: an archived event's id is already in the hot log")

// MaxArchiveBatchSize bounds [ArchiveOptions.BatchSize]: each batch's
// transaction holds the consumers table in SHARE mode, as a prune does.
const MaxArchiveBatchSize = 10_000

// archivedError is the error of an append to, or read of, archived stream.
// It names the command that restores this very stream.
func archivedError(stream projector.StreamRef) error {
	return fmt.Errorf("%w: %s (restore it: %s)", ErrStreamArchived, stream, unarchiveCommand(stream))
}

// unarchiveCommand is the CLI command that unarchives stream.
func unarchiveCommand(stream projector.StreamRef) string {
	cmd := "projector streams unarchive --stream " + projector.Printable(stream.Type) + "/" + projector.Printable(stream.ID)
	if stream.Tenant != projector.SystemTenant {
		cmd += " --tenant " + projector.Printable(stream.Tenant)
	}
	return cmd
}

// ArchiveOptions says which streams to archive (or unarchive): either
// Streams, or StreamType (with Tenant and, to archive, OlderThan).
type ArchiveOptions struct {
	// Streams names the streams one by one.
	Streams []projector.StreamRef
	// StreamType selects the streams of one type whose last append is
	// older than OlderThan (by the database clock). Required with it when
	// archiving; ignored by Unarchive, which restores every archived
	// stream of the type.
	StreamType string
	OlderThan  time.Duration
	// Tenant, with StreamType, keeps only that tenant's streams.
	Tenant string
	// DryRun counts what would move and moves nothing.
	DryRun bool
	// BatchSize is how many streams one transaction moves; default 100,
	// at most MaxArchiveBatchSize.
	BatchSize int
}

// ArchiveResult reports an archive or unarchive.
type ArchiveResult struct {
	// Cutoff is the time the last append had to be older than (zero when
	// streams were named, or for an unarchive).
	Cutoff time.Time
	// Streams and Events count what moved (would move, in a dry run).
	Streams, Events int64
	// HeldBack counts streams kept in the hot log because a consumer
	// shard that is not disabled has not passed all their events yet, or
	// an event of theirs has an open dead letter, or a consumer parked
	// them (ParkStream) (promise 9). In a dry
	// run, they are counted without the lock, so the figure is advisory.
	HeldBack int64
	// Skipped counts chosen streams that were being appended to at that
	// moment, or were appended to since they were chosen (no longer
	// closed), or were no longer in the state the command moves from.
	Skipped int64
}

type streamKeys struct{ tenants, types, ids []string }

func (k *streamKeys) add(t, st, id string) {
	k.tenants, k.types, k.ids = append(k.tenants, t), append(k.types, st), append(k.ids, id)
}

func (k *streamKeys) len() int { return len(k.ids) }

// Archive moves whole streams' events from projector_events to
// projector_events_archive and marks their heads archived, a batch of
// streams per transaction. A stream moves only when every consumer shard
// that is not disabled has passed all its events and none of them has an
// open dead letter (promise 9, as for [Store.Prune]); each batch locks the
// consumers table in SHARE mode before reading the slowest cursor, so a
// consumer registering or a rebuild rewinding meanwhile is either seen or
// waits for the batch to commit; a rebuild that starts later reads the
// archived events from the archive (docs/rebuilds.md).
// Unlike prune, a stale per-instance shard is not passed over: it holds
// archiving back until it is removed or disabled.
//
// Each batch locks the chosen heads (FOR UPDATE SKIP LOCKED) before it
// reads their events: a stream being appended to at that moment is
// skipped, not waited for, and an append that comes after waits for the
// batch and is refused with [ErrStreamArchived]. Nothing is lost either
// way, and an archive never deadlocks with a writer.
func (s *Store) Archive(ctx context.Context, opts ArchiveOptions) (ArchiveResult, error) {
	var res ArchiveResult
	if err := s.checkArchiveOptions(opts, true); err != nil {
		return res, err
	}
	var cutoff *time.Time
	if opts.StreamType != "" {
		var inRange bool
		if err := s.pool.QueryRow(ctx, `SELECT now() - make_interval(secs => $1), now() - make_interval(secs => $1) >= '0001-01-01 00:00:00+00'::timestamptz`,
			opts.OlderThan.Seconds()).Scan(&res.Cutoff, &inRange); err != nil {
			return res, fmt.Errorf("archive: read database clock: %w", err)
		}
		if !inRange {
			return ArchiveResult{}, fmt.Errorf("%w: an age of %v puts the cutoff before year 1", ErrInvalidArchive, opts.OlderThan)
		}
		cutoff = &res.Cutoff
	}
	err := s.eachBatch(ctx, opts, false, cutoff, func(k streamKeys) error {
		if opts.DryRun {
			return s.archiveCount(ctx, k, &res)
		}
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return s.archiveBatch(ctx, tx, k, cutoff, &res)
		})
	})
	if err != nil {
		return res, fmt.Errorf("archive: %w", err)
	}
	return res, nil
}

// Unarchive moves archived streams' events back into projector_events, at
// the log positions they had, and clears their heads' mark, a batch of
// streams per transaction: appends and plain reads work again. The events
// return behind every consumer's cursor (archiving waited until all had
// passed them), so no consumer applies them twice.
func (s *Store) Unarchive(ctx context.Context, opts ArchiveOptions) (ArchiveResult, error) {
	var res ArchiveResult
	if err := s.checkArchiveOptions(opts, false); err != nil {
		return res, err
	}
	err := s.eachBatch(ctx, opts, true, nil, func(k streamKeys) error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			locked, err := s.lockHeads(ctx, tx, k, true, nil)
			if err != nil {
				return err
			}
			res.Skipped += int64(k.len() - locked.len())
			if locked.len() == 0 {
				return nil
			}
			q := s.archiveSQL(unarchiveMoveSQL)
			if opts.DryRun {
				q = s.archiveSQL(unarchiveCountSQL)
			}
			var streams, events int64
			if err := tx.QueryRow(ctx, q, locked.tenants, locked.types, locked.ids).Scan(&streams, &events); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "23505" && strings.HasSuffix(pgErr.ConstraintName, "_id_key") {
					return fmt.Errorf("%w: %s", ErrUnarchiveConflict, projector.Printable(pgErr.Detail))
				}
				return fmt.Errorf("move back: %w", err)
			}
			res.Streams += streams
			res.Events += events
			return nil
		})
	})
	if err != nil {
		return res, fmt.Errorf("unarchive: %w", err)
	}
	return res, nil
}

func (s *Store) checkArchiveOptions(opts ArchiveOptions, archiving bool) error {
	if opts.BatchSize < 0 || opts.BatchSize > MaxArchiveBatchSize {
		return fmt.Errorf("%w: the batch size must be between 1 and %d, got %d", ErrInvalidArchive, MaxArchiveBatchSize, opts.BatchSize)
	}
	switch {
	case len(opts.Streams) > 0 && (opts.StreamType != "" || opts.Tenant != "" || opts.OlderThan != 0):
		return fmt.Errorf("%w: name streams, or a stream type (with an age and a tenant), not both", ErrInvalidArchive)
	case len(opts.Streams) == 0 && opts.StreamType == "":
		return fmt.Errorf("%w: name streams or a stream type", ErrInvalidArchive)
	case opts.StreamType != "" && archiving && opts.OlderThan <= 0:
		return fmt.Errorf("%w: archiving a stream type needs a positive age of the last event, got %v", ErrInvalidArchive, opts.OlderThan)
	}
	for _, st := range opts.Streams {
		if err := st.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidArchive, err)
		}
	}
	if opts.StreamType != "" {
		if err := projector.Stream(opts.StreamType, "-").Validate(); err != nil {
			return fmt.Errorf("%w: stream type %s cannot exist: %w", ErrInvalidArchive, projector.Printable(opts.StreamType), err)
		}
		ref := projector.StreamRef{Tenant: opts.Tenant, Type: opts.StreamType, ID: "-"}
		if err := ref.Validate(); opts.Tenant != "" && err != nil {
			return fmt.Errorf("%w: tenant %s cannot exist: %w", ErrInvalidArchive, projector.Printable(opts.Tenant), err)
		}
	}
	return nil
}

// eachBatch calls fn with batches of candidate streams: the named ones, or
// those of the stream type (archived or not, as archived says; last
// appended before cutoff when given) in key order. Candidates are chosen
// without a lock; fn locks and re-checks them.
func (s *Store) eachBatch(ctx context.Context, opts ArchiveOptions, archived bool, cutoff *time.Time, fn func(streamKeys) error) error {
	batch := cmp.Or(opts.BatchSize, 100)
	if len(opts.Streams) > 0 {
		// A stream named twice is moved, and counted, once.
		seen := make(map[projector.StreamRef]bool, len(opts.Streams))
		streams := make([]projector.StreamRef, 0, len(opts.Streams))
		for _, st := range opts.Streams {
			if !seen[st] {
				seen[st] = true
				streams = append(streams, st)
			}
		}
		for start := 0; start < len(streams); start += batch {
			var k streamKeys
			for _, st := range streams[start:min(start+batch, len(streams))] {
				k.add(st.Tenant, st.Type, st.ID)
			}
			if err := fn(k); err != nil {
				return err
			}
		}
		return nil
	}
	var tenant *string
	if opts.Tenant != "" {
		tenant = &opts.Tenant
	}
	after := [3]string{"", "", ""}
	first := true
	for {
		rows, err := s.pool.Query(ctx, s.archiveSQL(archiveChooseSQL), opts.StreamType, tenant, archived, cutoff, first, after[0], after[1], after[2], batch)
		if err != nil {
			return fmt.Errorf("choose streams: %w", err)
		}
		var k streamKeys
		var t, st, id string
		if _, err := pgx.ForEachRow(rows, []any{&t, &st, &id}, func() error {
			k.add(t, st, id)
			return nil
		}); err != nil {
			return fmt.Errorf("choose streams: %w", err)
		}
		if k.len() == 0 {
			return nil
		}
		if err := fn(k); err != nil {
			return err
		}
		if k.len() < batch {
			return nil
		}
		first, after = false, [3]string{t, st, id}
	}
}

// lockHeads locks the heads of k that are (not) archived and, with a
// cutoff, were last appended to before it, skipping those another
// transaction holds; it returns the ones it locked.
func (s *Store) lockHeads(ctx context.Context, tx pgx.Tx, k streamKeys, archived bool, cutoff *time.Time) (streamKeys, error) {
	rows, err := tx.Query(ctx, s.archiveSQL(lockHeadsSQL), k.tenants, k.types, k.ids, archived, cutoff)
	if err != nil {
		return streamKeys{}, fmt.Errorf("lock stream heads: %w", err)
	}
	var locked streamKeys
	var t, st, id string
	if _, err := pgx.ForEachRow(rows, []any{&t, &st, &id}, func() error {
		locked.add(t, st, id)
		return nil
	}); err != nil {
		return streamKeys{}, fmt.Errorf("lock stream heads: %w", err)
	}
	return locked, nil
}

// archiveBatch moves one batch under the retention lock: the guard is read
// after the consumers table is locked, the heads after the guard, and the
// events after the heads, each statement with a snapshot taken after the
// previous lock was granted, so an append or a rewind that committed
// before is seen and one that comes after waits.
func (s *Store) archiveBatch(ctx context.Context, tx pgx.Tx, k streamKeys, cutoff *time.Time, res *ArchiveResult) error {
	if _, err := tx.Exec(ctx, `LOCK TABLE `+s.Table("projector_consumers")+` IN SHARE MODE`); err != nil {
		return fmt.Errorf("lock consumers: %w", err)
	}
	guard, unguarded, err := s.archiveGuard(ctx, tx)
	if err != nil {
		return err
	}
	locked, err := s.lockHeads(ctx, tx, k, false, cutoff)
	if err != nil {
		return err
	}
	res.Skipped += int64(k.len() - locked.len())
	if locked.len() == 0 {
		return nil
	}
	var streams, events int64
	if err := tx.QueryRow(ctx, s.archiveSQL(archiveMoveSQL), locked.tenants, locked.types, locked.ids, guard.TxID, guard.Seq, unguarded).
		Scan(&streams, &events); err != nil {
		return fmt.Errorf("move: %w", err)
	}
	res.Streams += streams
	res.Events += events
	res.HeldBack += int64(locked.len()) - streams
	return nil
}

// archiveCount is a dry run's batch: what archiveBatch would move, read
// without locks in one snapshot.
func (s *Store) archiveCount(ctx context.Context, k streamKeys, res *ArchiveResult) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		guard, unguarded, err := s.archiveGuard(ctx, tx)
		if err != nil {
			return err
		}
		var candidates, streams, events int64
		if err := tx.QueryRow(ctx, s.archiveSQL(archiveCountSQL), k.tenants, k.types, k.ids, guard.TxID, guard.Seq, unguarded).
			Scan(&candidates, &streams, &events); err != nil {
			return fmt.Errorf("count: %w", err)
		}
		res.Streams += streams
		res.Events += events
		res.HeldBack += candidates - streams
		res.Skipped += int64(k.len()) - candidates
		return nil
	})
}

// archiveGuard is the lowest cursor of the shards that are not disabled;
// unguarded when there are none.
func (s *Store) archiveGuard(ctx context.Context, tx pgx.Tx) (projector.Position, bool, error) {
	var p projector.Position
	err := tx.QueryRow(ctx, `SELECT cursor_tx_id, cursor_seq FROM `+s.Table("projector_consumers")+`
		WHERE status <> 'disabled' ORDER BY cursor_tx_id, cursor_seq LIMIT 1`).Scan(&p.TxID, &p.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return projector.Position{}, true, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("read slowest consumer: %w", err)
	}
	return p, false, nil
}

// readStreamArchivedSQL is readStreamSQL over the hot table and the
// archive together, in the form mode (readMode). Not a hot path: the
// schema is filled in per call.
func (s *Store) readStreamArchivedSQL(mode readMode) string {
	where := ` e WHERE e.tenant_id = $1 AND e.stream_type = $2 AND e.stream_id = $3
	  AND e.version >= $4 AND e.version <= $5
	  AND ($6::timestamptz IS NULL OR e.recorded_at <= $6::timestamptz)`
	sql := `(SELECT e.*{{kc}} FROM (SELECT ` + eventColumns + ` FROM ` + s.Table("projector_events") + where +
		` UNION ALL SELECT ` + eventColumns + ` FROM ` + s.Table("projector_events_archive") + where + `) e{{kj}} ORDER BY e.version){{ke}}`
	return strings.ReplaceAll(withKeys(sql, mode, 7), "{{s}}", quoteIdent(s.schema))
}

// ArchiveSizes estimates the rows of the hot log and of the archive from
// the planner's statistics (pg_class.reltuples, refreshed by autovacuum
// and ANALYZE): cheap on any log, and approximate; -1 when a table was
// never analyzed.
func (s *Store) ArchiveSizes(ctx context.Context) (hot, archived int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT
		(SELECT reltuples::bigint FROM pg_class WHERE oid = $1::regclass),
		(SELECT reltuples::bigint FROM pg_class WHERE oid = $2::regclass)`,
		s.Table("projector_events"), s.Table("projector_events_archive")).Scan(&hot, &archived)
	if err != nil {
		return 0, 0, fmt.Errorf("estimate log sizes: %w", err)
	}
	return hot, archived, nil
}

func (s *Store) archiveSQL(q string) string {
	return strings.NewReplacer("{{e}}", s.Table("projector_events"), "{{a}}", s.Table("projector_events_archive"),
		"{{s}}", s.Table("projector_streams"), "{{d}}", s.Table("projector_dead_letters"),
		"{{p}}", s.Table("projector_parks"), "{{pe}}", s.Table("projector_parked_events")).Replace(q)
}

// archiveChooseSQL picks the next batch of streams of type $1 (tenant $2
// when not null) that are archived or not ($3), last appended to before $4
// (when not null), after the key $6/$7/$8 unless $5 says this is the first
// batch, at most $9, in key order.
const archiveChooseSQL = `SELECT s.tenant_id, s.stream_type, s.stream_id FROM {{s}} s
WHERE s.stream_type = $1 AND ($2::text IS NULL OR s.tenant_id = $2)
  AND (s.archived_at IS NOT NULL) = $3 AND ($4::timestamptz IS NULL OR s.updated_at < $4)
  AND ($5::bool OR (s.tenant_id, s.stream_type, s.stream_id) > ($6::text, $7::text, $8::text))
ORDER BY s.tenant_id, s.stream_type, s.stream_id LIMIT $9`

// lockHeadsSQL locks the named heads ($1–$3) that are archived or not ($4)
// and last appended to before $5 (when not null), re-checked on the row as
// it is once locked, skipping rows another transaction holds.
const lockHeadsSQL = `SELECT s.tenant_id, s.stream_type, s.stream_id
FROM {{s}} s JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id)
  ON s.tenant_id = k.t AND s.stream_type = k.st AND s.stream_id = k.id
WHERE (s.archived_at IS NOT NULL) = $4 AND ($5::timestamptz IS NULL OR s.updated_at < $5)
ORDER BY s.tenant_id, s.stream_type, s.stream_id
FOR UPDATE OF s SKIP LOCKED`

// archiveOK keeps, of the streams $1–$3, those every event of which the
// guard ($4/$5, or none when $6) has passed, none of which has an open
// dead letter, and that no consumer has parked (ParkStream) nor holds an
// event of in a park (a parked saga instance's events come from several
// streams): a park's retry reads its events from the hot log. A pass that parks a stream moves its
// cursor, which waits for the guard's SHARE lock, so a park committed after
// the guard was read holds only events the guard had not passed.
const archiveOK = `WITH ok AS (
	SELECT k.t, k.st, k.id FROM unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id)
	WHERE NOT EXISTS (SELECT 1 FROM {{p}} p WHERE p.status = 'parked'
		AND p.tenant_id = k.t AND p.stream_type = k.st AND p.stream_id = k.id)
	AND NOT EXISTS (SELECT 1 FROM {{e}} e WHERE e.tenant_id = k.t AND e.stream_type = k.st AND e.stream_id = k.id
		AND ((NOT $6::bool AND (e.tx_id, e.seq) > ($4::xid8, $5::bigint))
		  OR EXISTS (SELECT 1 FROM {{d}} d WHERE d.event_id = e.id AND d.status = 'open')
		  OR EXISTS (SELECT 1 FROM {{pe}} pk WHERE pk.event_id = e.id)))
)`

const archiveColumns = `tx_id, seq, id, tenant_id, stream_type, stream_id, version, type, schema_version, data,
	correlation_id, causation_id, actor, headers, recorded_at, envelope`

// archiveMoveSQL moves the events of the streams archiveOK keeps and marks
// their heads, in one statement.
const archiveMoveSQL = archiveOK + `, moved AS (
	DELETE FROM {{e}} e USING ok WHERE e.tenant_id = ok.t AND e.stream_type = ok.st AND e.stream_id = ok.id
	RETURNING e.*
), kept AS (
	INSERT INTO {{a}} (` + archiveColumns + `) SELECT ` + archiveColumns + ` FROM moved RETURNING 1
), marked AS (
	UPDATE {{s}} s SET archived_at = now() FROM ok
	WHERE s.tenant_id = ok.t AND s.stream_type = ok.st AND s.stream_id = ok.id RETURNING 1
)
SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM kept)`

// archiveCountSQL is a dry run's archiveMoveSQL: the candidates that are
// not archived yet, those the guard lets go and their events.
const archiveCountSQL = archiveOK + `
SELECT (SELECT count(*) FROM {{s}} s JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id)
		ON s.tenant_id = k.t AND s.stream_type = k.st AND s.stream_id = k.id WHERE s.archived_at IS NULL),
	(SELECT count(*) FROM ok JOIN {{s}} s ON s.tenant_id = ok.t AND s.stream_type = ok.st AND s.stream_id = ok.id WHERE s.archived_at IS NULL),
	(SELECT count(*) FROM ok JOIN {{s}} s ON s.tenant_id = ok.t AND s.stream_type = ok.st AND s.stream_id = ok.id AND s.archived_at IS NULL
		JOIN {{e}} e ON e.tenant_id = ok.t AND e.stream_type = ok.st AND e.stream_id = ok.id)`

// unarchiveMoveSQL moves the events of the locked archived streams $1–$3
// back to their positions and clears the mark.
const unarchiveMoveSQL = `WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id)
), back AS (
	DELETE FROM {{a}} a USING k WHERE a.tenant_id = k.t AND a.stream_type = k.st AND a.stream_id = k.id
	RETURNING a.*
), put AS (
	INSERT INTO {{e}} (` + archiveColumns + `) OVERRIDING SYSTEM VALUE
	SELECT ` + archiveColumns + ` FROM back RETURNING 1
), marked AS (
	UPDATE {{s}} s SET archived_at = NULL FROM k
	WHERE s.tenant_id = k.t AND s.stream_type = k.st AND s.stream_id = k.id RETURNING 1
)
SELECT (SELECT count(*) FROM marked), (SELECT count(*) FROM put)`

// unarchiveCountSQL is a dry run's unarchiveMoveSQL.
const unarchiveCountSQL = `SELECT count(DISTINCT (a.tenant_id, a.stream_type, a.stream_id)), count(*)
FROM {{a}} a JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id)
  ON a.tenant_id = k.t AND a.stream_type = k.st AND a.stream_id = k.id`

package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
)

// Import batch sizes: the default and the most [ImportOptions.BatchSize]
// may ask (a batch is held in memory while it is checked and copied).
const (
	DefaultImportBatchSize = 10_000
	MaxImportBatchSize     = 1_000_000
)

// ImportOptions configures [Store.Import].
type ImportOptions struct {
	// BatchSize is the number of events written per transaction; default
	// [DefaultImportBatchSize], at most [MaxImportBatchSize].
	BatchSize int
	// WithoutInline skips the store's inline projections, which an import
	// otherwise applies to each batch as an append would: faster, but
	// their read models then miss the imported events until they are
	// rebuilt.
	WithoutInline bool
	// Progress, when set, is called after each committed batch.
	Progress func(ImportResult)
}

// ImportResult is what an import did.
type ImportResult struct {
	// Lines counts the events read.
	Lines int64
	// Imported counts the events written; Skipped the events the log
	// already held (the same id at the same stream and version: an import
	// run again after it was interrupted).
	Imported, Skipped int64
	// Batches counts the committed transactions that wrote events.
	Batches int
}

// importColumns are the columns an import writes; tx_id and seq take their
// defaults, as on append, which is what puts imported events in the log's
// order after everything committed before them.
var importColumns = []string{"id", "tenant_id", "stream_type", "stream_id", "version", "type",
	"schema_version", "data", "correlation_id", "causation_id", "actor", "headers", "recorded_at", "envelope"}

// Import reads a history file (see [HistoryEvent]) and appends its events
// to the log with PostgreSQL's COPY, in batches of opts.BatchSize events,
// one transaction each. Each event is checked before its batch commits
// (rows are streamed to the COPY as their lines are decoded and checked, in
// file order, and a bad line aborts it): the format, its type defined in
// the registry and its payload decodable at its schema version (upcasters
// run, payloads that implement [projector.Validator] are validated), its id
// not repeated, and its stream's versions contiguous, continuing the
// version the stream has in the log. A bad event fails the import with a [*HistoryLineError] naming its
// line; nothing of its batch is written, the batches before it stay.
//
// Imported events keep their ids, versions, payloads, metadata and
// recording times; they get log positions of the import's transactions, in
// the file's order. A consumer reads them exactly once, like appended ones,
// and the per-stream order rule of appends holds: a batch that finds a
// stream advanced by a younger transaction fails with a
// [*projector.ConcurrencyError], and nothing of it is written.
//
// Running an import again after it was interrupted continues it: an event
// already in the log, with the same id at the same stream and version, is
// skipped (ImportResult.Skipped); a different event there is an error.
//
// The store's inline projections are applied to each batch inside its
// transaction, one stream's run of events at a time scoped to its tenant,
// as appends apply them, unless opts.WithoutInline; a failing one fails the
// batch, with the line of the run's first event.
func (s *Store) Import(ctx context.Context, r io.Reader, opts ImportOptions) (ImportResult, error) {
	return s.importWith(ctx, r, opts, importWorkers())
}

// importWith is Import with workers goroutines decoding each batch.
func (s *Store) importWith(ctx context.Context, r io.Reader, opts ImportOptions, workers int) (ImportResult, error) {
	size := cmp.Or(opts.BatchSize, DefaultImportBatchSize)
	if size < 1 || size > MaxImportBatchSize {
		return ImportResult{}, fmt.Errorf("%w: import: batch size %d: want 1 to %d", ErrInvalidConfig, size, MaxImportBatchSize)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the reader when a batch fails
	dec := NewHistoryDecoder(r)
	if _, err := dec.Header(); err != nil {
		return ImportResult{}, fmt.Errorf("import: %w", err)
	}
	var res ImportResult
	analyzed := false
	// Batches written are given back to the reader, to read into again,
	// unless inline projections were handed their events (and could keep
	// their bytes).
	free := make(chan *importBatch, 2)
	reuse := opts.WithoutInline || len(s.inline) == 0
	for b := range s.readBatches(ctx, dec, size, workers, free) {
		lines, imported, skipped, err := s.writeBatch(ctx, b, !opts.WithoutInline)
		res.Lines += int64(lines)
		if err != nil {
			return res, fmt.Errorf("import: %w", err)
		}
		res.Imported += imported
		res.Skipped += skipped
		if imported > 0 {
			res.Batches++
			if !analyzed {
				analyzed = true
				if err := s.analyzeAfterFirstBatch(ctx, imported); err != nil {
					return res, fmt.Errorf("import: %w", err)
				}
			}
		}
		if opts.Progress != nil && lines > 0 {
			opts.Progress(res)
		}
		if reuse {
			select {
			case free <- b:
			default:
			}
		}
	}
	return res, ctx.Err()
}

// analyzeAfterFirstBatch refreshes the planner's statistics of the events
// and stream heads tables once the import's first batch committed
// imported events, when the statistics counted fewer rows than that batch
// wrote (a fresh log: -1, never analyzed, or analyzed nearly empty).
// Autovacuum may be off or behind a fast import, and without statistics
// the planner took the id lookup of a resumed import's batches for a
// sequential scan and a hash of the whole events table (800 ms a batch at
// 200,000 events, against 57 ms by the id index once analyzed,
// docs/performance.md "History import"), and the stream heads' update for
// a scan of every head. Once is enough: the planner scales the row
// counts it read to the tables' current size, and what ANALYZE adds is
// what a bigger log does not change (ids unique, a stream's events
// clustered). ANALYZE takes a lock that lets appends, reads and the next
// batches run beside it; a role that does not own the tables gets a
// warning from PostgreSQL, not an error, and the import goes on.
func (s *Store) analyzeAfterFirstBatch(ctx context.Context, imported int64) error {
	var rows float64
	if err := s.pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`,
		s.Table("projector_events")).Scan(&rows); err != nil {
		return fmt.Errorf("read the log's statistics: %w", err)
	}
	if rows >= float64(imported) {
		return nil
	}
	if _, err := s.pool.Exec(ctx, s.sqlFor(`ANALYZE {{s}}.projector_events, {{s}}.projector_streams`)); err != nil {
		return fmt.Errorf("analyze the log after the first batch: %w", err)
	}
	return nil
}

var validatorType = reflect.TypeFor[projector.Validator]()

// validatePayload runs a decoded payload's Validate, as an append runs it
// on the payload it is given (on the value or, when only the pointer has
// the method, on a pointer to it).
func validatePayload(payload any) error {
	v, ok := payload.(projector.Validator)
	if !ok {
		t := reflect.TypeOf(payload)
		if !reflect.PointerTo(t).Implements(validatorType) {
			return nil // no Validate: nothing to copy the payload for
		}
		p := reflect.New(t)
		p.Elem().Set(reflect.ValueOf(payload))
		v, ok = p.Interface().(projector.Validator)
	}
	if !ok {
		return nil
	}
	if err := v.Validate(); err != nil {
		return fmt.Errorf("%w: %w", projector.ErrInvalidPayload, err)
	}
	return nil
}

// importPrepareSQL is a batch's one statement before its COPY: it reads
// each stream's version from the log itself, hot and archived, through the
// (stream, version) unique indexes (the log is the truth the import
// continues, whatever keeps stream heads; an archived stream's events are
// all in the archive), and moves the stream heads of the streams the batch
// advances, by the same rules as an append's head write: a stream is
// created (at version 0 in the log) or advanced only from the version just
// read, and only by a transaction no older than the one that last appended
// to it (promise 4), so imported and appended events keep version order
// equal to log order. An archived stream's head is not advanced, as an
// append's head write refuses it: the check is in the UPDATE, on the row
// as it is once locked, so an archive that committed after the versions
// were read is seen, and one that comes after skips the locked head. The
// heads are written before the events, as an
// append writes them: a concurrent appender of the same stream waits on
// the head row, or the import on the appender's, and the loser's check
// fails. A batch the client then refuses (a version gap, an event that is
// not the one the log holds) rolls back with its heads.
//
// Each row is one stream, in the order given: its version in the log, and,
// the same on every row, whether the archive holds any event (when it holds
// none, no id of the batch can be in it and the import skips looking them
// up: a round trip and a 10,000-element array saved in each batch of the
// usual import, into a log never archived), the number of heads written
// (fewer than the streams advanced means another writer got there first)
// and the transaction's id.
const importPrepareSQL = `
WITH t AS (
	SELECT t.*, GREATEST(
		(SELECT max(e.version) FROM {{s}}.projector_events e
			WHERE e.tenant_id = t.tenant AND e.stream_type = t.stream_type AND e.stream_id = t.stream_id),
		(SELECT max(a.version) FROM {{s}}.projector_events_archive a
			WHERE a.tenant_id = t.tenant AND a.stream_type = t.stream_type AND a.stream_id = t.stream_id), 0) AS current
	FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS t(tenant, stream_type, stream_id, last, ord)
), advanced AS (
	UPDATE {{s}}.projector_streams AS s
	SET version = t.last, last_tx_id = pg_current_xact_id(), updated_at = now()
	FROM t
	WHERE t.current > 0 AND t.last > t.current
	  AND s.tenant_id = t.tenant AND s.stream_type = t.stream_type AND s.stream_id = t.stream_id
	  AND s.version = t.current AND s.last_tx_id <= pg_current_xact_id() AND s.archived_at IS NULL
	RETURNING 1
), created AS (
	INSERT INTO {{s}}.projector_streams (tenant_id, stream_type, stream_id, version, last_tx_id)
	SELECT t.tenant, t.stream_type, t.stream_id, t.last, pg_current_xact_id()
	FROM t WHERE t.current = 0
	ORDER BY t.tenant, t.stream_type, t.stream_id
	ON CONFLICT (tenant_id, stream_type, stream_id) DO NOTHING
	RETURNING 1
)
SELECT t.current, (SELECT EXISTS (SELECT FROM {{s}}.projector_events_archive)),
	(SELECT count(*) FROM advanced) + (SELECT count(*) FROM created), pg_current_xact_id()
FROM t ORDER BY t.ord`

// importExistingSQL looks up events by id, in the hot log and the archive,
// to tell an event imported before (a resumed import) from a different one,
// and to name the line of an id the log already holds.
// The ids are joined from unnest, not matched with = ANY($1): the planner
// estimates an ANY of a bound array element by element, which for a batch
// of 10,000 ids cost more than the lookups themselves.
//
// same says whether the stored event is the line's: its type, schema
// version and payload ($2–$4; jsonb equality, so key order and spacing do
// not matter), the payload as the line holds it or, for a row whose
// envelope is kept apart, as DetachEnvelope splits it ($5, $6). A line
// whose personal fields are in the clear (the import seals them, each
// time under a new nonce) has no payload to compare ($4 NULL).
const importExistingSQL = `
SELECT e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, ` + importSameSQL + `
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::jsonb[], $5::jsonb[], $6::bytea[]) AS u(id, type, sv, data, part, env)
JOIN {{s}}.projector_events e ON e.id = u.id
UNION ALL
SELECT e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, ` + importSameSQL + `
FROM unnest($1::uuid[], $2::text[], $3::int[], $4::jsonb[], $5::jsonb[], $6::bytea[]) AS u(id, type, sv, data, part, env)
JOIN {{s}}.projector_events_archive e ON e.id = u.id`

const importSameSQL = `coalesce(e.type = u.type AND e.schema_version = u.sv AND (u.data IS NULL
	OR e.envelope IS NULL AND e.data = u.data
	OR e.envelope = u.env AND e.data = u.part), false)`

// importArchivedIDSQL finds an id of the batch's new events that an
// archived event holds: the events table's unique id index does not see the
// archive, and unarchiving such a stream would collide. Joined from unnest
// for the reason importExistingSQL is.
const importArchivedIDSQL = `
SELECT a.id, a.tenant_id, a.stream_type, a.stream_id, a.version
FROM unnest($1::uuid[]) AS u(id) JOIN {{s}}.projector_events_archive a ON a.id = u.id LIMIT 1`

// importTakenIDSQL finds where the log holds one of the batch's ids, after a
// COPY tripped on the unique id index, so the error can say where it is.
const importTakenIDSQL = `
SELECT e.id, e.tenant_id, e.stream_type, e.stream_id, e.version
FROM unnest($1::uuid[]) AS u(id) JOIN {{s}}.projector_events e ON e.id = u.id LIMIT 1`

// takenID is an event of the log (or its archive) holding an id an import
// line brings for another place.
type takenID struct {
	id      [16]byte
	stream  projector.StreamRef
	version int64
}

func (t *takenID) scan(row pgx.Row) error {
	return row.Scan(&t.id, &t.stream.Tenant, &t.stream.Type, &t.stream.ID, &t.version)
}

// lineError names the batch's line that brings t's id, with where the log
// holds it (the stream through StreamRef.String, so stored names reach a
// terminal printable); where says "log" or "log's archive".
func (t takenID) lineError(b *importBatch, keep []int, where string) error {
	err := fmt.Errorf("%w: event id %s is already in the %s, at %s version %d", ErrInvalidHistory, uuid.UUID(t.id), where, t.stream, t.version)
	for _, k := range keep {
		if b.events[k].ID == t.id {
			return &HistoryLineError{Line: b.lines[k], Err: err}
		}
	}
	return err
}

// writeBatch writes one batch in one transaction and returns how many of
// its lines were read before a bad one (all of them when none is bad).
func (s *Store) writeBatch(ctx context.Context, b *importBatch, inline bool) (lines int, imported, skipped int64, err error) {
	lines, imported, skipped, err = s.writeBatchOnce(ctx, b, inline)
	if errors.Is(err, errReplan) && !b.replanned {
		b.replan()
		lines, imported, skipped, err = s.writeBatchOnce(ctx, b, inline)
	}
	return lines, imported, skipped, err
}

// writeBatchOnce writes the batch as planned: the versions read from the
// log and the stream heads advanced in one statement, then the batch's
// rows streamed to COPY as its lines are decoded and checked in file
// order (a bad line aborts the COPY, and the transaction rolls back), then
// the events the log already held checked, the inline projections applied
// and the transaction committed.
func (s *Store) writeBatchOnce(ctx context.Context, b *importBatch, inline bool) (lines int, imported, skipped int64, err error) {
	if len(b.spans) == 0 {
		return 0, 0, 0, b.readErr
	}
	applyInline := inline && len(s.inline) > 0
	// Personal fields are sealed, or checked, in the batch's transaction
	// before anything else (history_import_personal.go): a key it creates
	// is taken before the stream heads, in the order an append takes them.
	personal := s.registry.HasPersonal()
	tx, err := s.beginImportTx(ctx, applyInline || personal)
	if err != nil {
		return 0, 0, 0, err
	}
	defer tx.close(context.WithoutCancel(ctx))
	if personal {
		if err := s.sealImported(ctx, tx.tx, b); err != nil {
			return 0, 0, 0, err
		}
	}

	tenants, types, ids := make([]string, len(b.refs)), make([]string, len(b.refs)), make([]string, len(b.refs))
	for i, r := range b.refs {
		tenants[i], types[i], ids[i] = r.Tenant, r.Type, r.ID
	}
	c := &importCopy{ctx: ctx, s: s, b: b, inline: inline, current: make([]int64, 0, len(b.refs))}
	var archived bool
	var written int64
	var txID uint64
	var v int64
	err = tx.prepare(ctx, s.sqlFor(importPrepareSQL), []any{tenants, types, ids, b.last}, []any{&v, &archived, &written, &txID}, func() error {
		c.current = append(c.current, v)
		return nil
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("read stream versions and advance their heads: %w", mapError(projector.StreamRef{}, projector.AnyVersion, err))
	}
	advanced := int64(0)
	for r := range b.refs {
		if b.last[r] > c.current[r] {
			advanced++
		}
	}
	if written != advanced {
		if err := s.importArchived(ctx, tx, b, c.current); err != nil {
			return 0, 0, 0, err
		}
		return 0, 0, 0, &projector.ConcurrencyError{Actual: -1, Expected: projector.AnyVersion,
			Reason: fmt.Sprintf("%d of %d streams were appended to during the import, or by a younger transaction; run the import again", advanced-written, advanced)}
	}
	tag, err := tx.pgConn().CopyFrom(ctx, c, s.importCopySQL())
	if c.err != nil {
		return c.lines, 0, 0, c.err
	}
	if err != nil {
		return len(b.spans), 0, 0, s.importCopyError(ctx, b, c.keep, err)
	}
	lines = len(b.spans)
	if n := tag.RowsAffected(); n != int64(len(c.keep)) {
		return lines, 0, 0, fmt.Errorf("copied %d of %d events", n, len(c.keep))
	}
	// Events at or below their stream's version in the log were not
	// copied: they must be the very events the log holds (an import run
	// again), to skip.
	if len(c.seen) > 0 {
		if err := s.checkImported(ctx, tx, b, c.seen); err != nil {
			return lines, 0, 0, err
		}
	}
	if len(c.keep) == 0 {
		return lines, 0, int64(len(c.seen)), nil
	}
	if archived {
		if err := s.checkArchivedIDs(ctx, tx, b, c.keep); err != nil {
			return lines, 0, 0, err
		}
	}
	if applyInline {
		if err := s.applyInlineImported(ctx, tx.tx, b, c.keep); err != nil {
			return lines, 0, 0, err
		}
	}
	if err := tx.commit(ctx); err != nil {
		return lines, 0, 0, fmt.Errorf("commit: %w", err)
	}
	s.appended(txID)
	return lines, int64(len(c.keep)), int64(len(c.seen)), nil
}

// applyInlineImported applies the store's inline projections to the
// batch's new events, as appends would have: each stream's run of
// consecutive events in one call, with their log positions (read back from
// this transaction's rows) and decoded payloads, scoped to the stream's
// tenant.
func (s *Store) applyInlineImported(ctx context.Context, tx pgx.Tx, b *importBatch, keep []int) error {
	rows, err := tx.Query(ctx, s.sqlFor(`SELECT id, tx_id, seq FROM {{s}}.projector_events WHERE tx_id = pg_current_xact_id()`))
	if err != nil {
		return fmt.Errorf("read imported positions: %w", err)
	}
	positions := make(map[uuid.UUID]projector.Position, len(keep))
	var id [16]byte
	var pos projector.Position
	if _, err := pgx.ForEachRow(rows, []any{&id, &pos.TxID, &pos.Seq}, func() error {
		positions[id] = pos
		return nil
	}); err != nil {
		return fmt.Errorf("read imported positions: %w", err)
	}
	info := map[string]int{}
	for start := 0; start < len(keep); {
		end := start + 1
		for end < len(keep) && b.events[keep[end]].Stream == b.events[keep[start]].Stream {
			end++
		}
		run := make([]projector.Event, 0, end-start)
		for _, k := range keep[start:end] {
			ev := b.events[k].Event()
			ev.Position, ev.Payload, ev.Data, ev.Forgotten = positions[ev.ID], b.payloads[k], b.data[k], b.forgotten[k]
			v, ok := info[ev.Type]
			if !ok {
				t, _ := s.registry.Lookup(ev.Type)
				v, info[ev.Type] = t.SchemaVersion, t.SchemaVersion
			}
			ev.SchemaVersion = v
			run = append(run, ev)
		}
		if err := s.ScopeTx(ctx, tx, run[0].Stream.Tenant); err != nil {
			return err
		}
		for _, p := range s.inline {
			if err := p.ApplyInline(ctx, tx, run); err != nil {
				return &HistoryLineError{Line: b.lines[keep[start]], Err: fmt.Errorf("inline projection %q: %w", p.Name(), err)}
			}
		}
		start = end
	}
	return s.ScopeTx(ctx, tx, projector.SystemTenant)
}

// importArchived says why a batch's heads fell short when an archived
// stream is the reason: ErrStreamArchived naming the first of the streams
// the batch would advance (versions past current) whose head is archived.
// A batch never continues an archived stream: its events would go to the
// hot log of a stream whose earlier events are in the archive, and a plain
// read would return them as the stream's whole history.
func (s *Store) importArchived(ctx context.Context, tx *importTx, b *importBatch, current []int64) error {
	var tenants, types, ids []string
	for r, ref := range b.refs {
		if b.last[r] > current[r] {
			tenants, types, ids = append(tenants, ref.Tenant), append(types, ref.Type), append(ids, ref.ID)
		}
	}
	var ref projector.StreamRef
	err := tx.QueryRow(ctx, s.sqlFor(`SELECT s.tenant_id, s.stream_type, s.stream_id FROM {{s}}.projector_streams s
		JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(t, st, id) ON s.tenant_id = k.t AND s.stream_type = k.st AND s.stream_id = k.id
		WHERE s.archived_at IS NOT NULL ORDER BY 1, 2, 3 LIMIT 1`), tenants, types, ids).Scan(&ref.Tenant, &ref.Type, &ref.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up archived streams: %w", err)
	}
	return fmt.Errorf("%w (the import continues it past its archived events)", archivedError(ref))
}

// checkImported checks that events at versions their streams already have
// are the very events the log holds there.
func (s *Store) checkImported(ctx context.Context, tx *importTx, b *importBatch, seen []int) error {
	type stored struct {
		stream  projector.StreamRef
		version int64
		same    bool // the line's type, schema version and payload
	}
	ids := make([][16]byte, len(seen))
	types := make([]string, len(seen))
	versions := make([]int32, len(seen))
	datas, parts := make([]*string, len(seen)), make([]*string, len(seen))
	envs := make([][]byte, len(seen))
	var personal typePersonal
	for i, k := range seen {
		h := &b.events[k]
		ids[i], types[i], versions[i] = h.ID, h.Type, int32(h.SchemaVersion)
		if _, sealedHere := b.sealedFrom[k]; sealedHere {
			continue // clear in the file, sealed here under a new nonce: no payload to compare
		}
		if p, ok := personal.of(s.registry, h.Type); ok && !projector.IsSealed(h.Payload) && p.HoldsClearValue(h.Payload) {
			continue
		}
		full := string(h.Payload)
		datas[i] = &full
		if part, env, ok, err := projector.DetachEnvelope(h.Payload); err == nil && ok {
			p := string(part)
			parts[i], envs[i] = &p, env
		}
	}
	rows, err := tx.Query(ctx, s.sqlFor(importExistingSQL), uuidArray(ids), types, versions, datas, parts, envs)
	if err != nil {
		return fmt.Errorf("look up imported events: %w", err)
	}
	have := map[uuid.UUID]stored{}
	var id [16]byte
	var st stored
	_, err = pgx.ForEachRow(rows, []any{&id, &st.stream.Tenant, &st.stream.Type, &st.stream.ID, &st.version, &st.same}, func() error {
		have[id] = st
		return nil
	})
	if err != nil {
		return fmt.Errorf("look up imported events: %w", err)
	}
	for _, k := range seen {
		h := &b.events[k]
		if got, ok := have[h.ID]; !ok || got.stream != h.Stream.Ref() || got.version != h.Version {
			return &HistoryLineError{Line: b.lines[k], Err: fmt.Errorf("%w: stream %s already has version %d, and it is not event %s",
				ErrInvalidHistory, h.Stream.Ref(), h.Version, h.ID)}
		}
		if !have[h.ID].same {
			// The log is never rewritten: a file edited since it was
			// imported is refused, not skipped as if it matched.
			return &HistoryLineError{Line: b.lines[k], Err: fmt.Errorf("%w: event %s is in the log already (stream %s, version %d) with another type, schema version or payload: the line differs from the event it was imported as",
				ErrInvalidHistory, h.ID, h.Stream.Ref(), h.Version)}
		}
	}
	return nil
}

// checkArchivedIDs refuses, at its line, a new event whose id an archived
// event holds.
func (s *Store) checkArchivedIDs(ctx context.Context, tx *importTx, b *importBatch, keep []int) error {
	ids := make([][16]byte, len(keep))
	for i, k := range keep {
		ids[i] = b.events[k].ID
	}
	var found takenID
	err := found.scan(tx.QueryRow(ctx, s.sqlFor(importArchivedIDSQL), uuidArray(ids)))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up archived ids: %w", err)
	}
	return found.lineError(b, keep, "log's archive")
}

// importCopyError says which line a failed COPY tripped on where it can:
// an id the log already holds elsewhere is found by looking the batch's ids
// up, after the failed transaction is gone.
func (s *Store) importCopyError(ctx context.Context, b *importBatch, keep []int, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		return fmt.Errorf("copy events: %w", err)
	}
	if !strings.Contains(pgErr.ConstraintName, "_id_key") && !strings.HasSuffix(pgErr.ConstraintName, "_pkey") {
		// The (stream, version) key: another writer appended to a stream
		// between the version check and the copy.
		return fmt.Errorf("%w (%s)", &projector.ConcurrencyError{Actual: -1, Reason: "a stream was appended to during the import: " + pgErr.Message}, pgErr.Code)
	}
	ids := make([][16]byte, len(keep))
	for i, k := range keep {
		ids[i] = b.events[k].ID
	}
	var found takenID
	if found.scan(s.pool.QueryRow(ctx, s.sqlFor(importTakenIDSQL), uuidArray(ids))) == nil {
		return found.lineError(b, keep, "log")
	}
	return fmt.Errorf("copy events: %w", err)
}

// sqlFor fills the schema into an import or export statement.
func (s *Store) sqlFor(sql string) string {
	return strings.ReplaceAll(sql, "{{s}}", quoteIdent(s.schema))
}

package postgres

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/projectorhq/projector"
)

// StreamQuery bounds a stream read. The zero value reads the whole stream.
type StreamQuery struct {
	// FromVersion is the first version to read; 0 means 1.
	FromVersion int64
	// ToVersion is the last version to read; 0 means the end.
	ToVersion int64
	// Until, when set, stops at the last event recorded at or before it.
	Until time.Time
	// IncludeArchived reads an archived stream's events from the archive
	// (`projector streams archive`). Without it, a read of an archived
	// stream fails with [ErrStreamArchived] rather than reading as empty.
	IncludeArchived bool
	// Raw skips decoding, as [LogQuery.Raw] does: events carry Data but no
	// Payload, and types the registry does not know are returned instead
	// of failing the read — for tools that show events without the
	// application's types (the stock CLI's `parked show`).
	Raw bool
}

// ReadStream reads a stream's events in version order through the pool. A
// stream that does not exist reads as no events; a read from version 1 of
// an archived one fails with [ErrStreamArchived] unless q.IncludeArchived.
func (s *Store) ReadStream(ctx context.Context, stream projector.StreamRef, q StreamQuery) ([]projector.Event, error) {
	return s.ReadStreamTx(ctx, s.pool, stream, q)
}

// ReadStreamTx is [Store.ReadStream] inside the caller's transaction (or on
// any connection), so a read and a later append see the same state.
func (s *Store) ReadStreamTx(ctx context.Context, db DBTX, stream projector.StreamRef, q StreamQuery) ([]projector.Event, error) {
	if err := stream.Validate(); err != nil {
		return nil, fmt.Errorf("read stream: %w", err)
	}
	from := max(q.FromVersion, 1)
	to := q.ToVersion
	if to <= 0 {
		to = math.MaxInt64
	}
	var until *time.Time
	if !q.Until.IsZero() {
		until = &q.Until
	}
	mode, keyArgs := s.readKeys()
	args := append([]any{stream.Tenant, stream.Type, stream.ID, from, to, until}, keyArgs...)
	if q.IncludeArchived {
		rows, err := db.Query(ctx, s.readStreamArchivedSQL(mode), args...)
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", stream, err)
		}
		events, err := s.collect(ctx, db, rows, q.Raw)
		if err != nil {
			return nil, fmt.Errorf("read stream %s: %w", stream, err)
		}
		return events, nil
	}
	rows, err := db.Query(ctx, s.sql.read[mode].stream, args...)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	// A read after a snapshot's version may come back empty on any
	// stream, and the snapshot is exact; only one from the start of an
	// archived stream (no events left in the hot table) is refused.
	var archived bool
	events, err := s.collectMarked(ctx, db, rows, q.Raw, &archived)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", stream, err)
	}
	if archived && len(events) == 0 {
		return nil, fmt.Errorf("read stream %s: %w (to read it, set IncludeArchived in postgres.StreamQuery, or in aggregate.Query with Repository.LoadTx; to restore it: %s)", stream, ErrStreamArchived, unarchiveCommand(stream))
	}
	return events, nil
}

// StreamVersion returns the stream's current version, or an error matching
// [projector.ErrNotFound] if it does not exist. An invalid reference is
// refused before anything is sent ([projector.ErrInvalidStream]).
func (s *Store) StreamVersion(ctx context.Context, db DBTX, stream projector.StreamRef) (int64, error) {
	if err := stream.Validate(); err != nil {
		return 0, fmt.Errorf("stream version: %w", err)
	}
	var version int64
	var last uint64
	var mine *uint64
	var archived bool
	err := db.QueryRow(ctx, s.sql.streamHead, stream.Tenant, stream.Type, stream.ID).Scan(&version, &last, &mine, &archived)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("stream %s: %w", stream, projector.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s version: %w", stream, err)
	}
	return version, nil
}

// DefaultReadLimit is the batch size of a log read that names none.
const DefaultReadLimit = 500

// LogQuery selects a slice of the global log.
type LogQuery struct {
	// After is the cursor: the read starts after this position.
	After projector.Position
	// Limit caps the events returned; 0 means [DefaultReadLimit].
	Limit int
	// EventTypes, when non-empty, keeps only these types.
	EventTypes []string
	// StreamTypes, when non-empty, keeps only these stream types.
	StreamTypes []string
	// Partition keeps only the streams of one hash segment (a partition
	// of a partitioned consumer), read through the log's partition index.
	// The zero Segment reads every stream.
	Partition Segment
	// IncludeArchived also reads the archive (`projector streams
	// archive`): archived events come back at their places in log order,
	// read in the same statement, so in one snapshot, as the hot log's
	// (an archive or unarchive moving streams meanwhile never makes an
	// event come twice or go missing). A reader whose position is at or
	// after the archive's last event ([Store.ArchivedAfter] false) needs
	// it only if streams are archived past its position later, which the
	// archive's guard (promise 9) forbids for a registered consumer shard
	// that is not disabled.
	IncludeArchived bool
	// Raw skips decoding: events carry Data but no Payload, and types the
	// registry does not know are returned instead of failing the read.
	// Data is upcast to the type's current schema version; an event whose
	// upcaster refuses it comes back as stored, at its stored (older)
	// SchemaVersion, so the reader can tell. The dispatcher fails such an
	// event for every handler form, as it does for typed handlers.
	Raw bool
}

// LogBatch is one read of the global log.
type LogBatch struct {
	// Events are in log order, all from finished transactions.
	Events []projector.Event
	// Horizon is the oldest transaction id that was still running when the
	// read was taken: every event of an older transaction is final.
	Horizon uint64
	// Full reports that Limit events came back, so more may follow at once.
	Full bool
}

// Next returns where a cursor that started at after may move once every
// event of the batch is processed. For a full batch that is the last event;
// otherwise every matching event below the horizon has been seen, so the
// cursor may move up to the horizon even if the filter matched nothing.
func (b LogBatch) Next(after projector.Position) projector.Position {
	next := after
	if n := len(b.Events); n > 0 {
		next = b.Events[n-1].Position
	}
	if !b.Full {
		if h := projector.Horizon(b.Horizon); next.Less(h) {
			next = h
		}
	}
	return next
}

// ReadLog reads the global log through the pool. See [Store.ReadLogTx].
func (s *Store) ReadLog(ctx context.Context, q LogQuery) (LogBatch, error) {
	return s.ReadLogTx(ctx, s.pool, q)
}

// ReadLogTx reads the events after q.After in (transaction id, sequence)
// order, taking only events whose transaction finished before the read's
// snapshot: the gap-safe read. A cursor that only ever moves to
// [LogBatch.Next] never passes an event that commits later, whatever order
// concurrent transactions commit in (promise 3). A long-running transaction
// holds the horizon back, delaying delivery of later events until it ends;
// it never loses them.
func (s *Store) ReadLogTx(ctx context.Context, db DBTX, q LogQuery) (LogBatch, error) {
	limit := cmp.Or(q.Limit, DefaultReadLimit)
	if limit < 0 {
		return LogBatch{}, fmt.Errorf("%w: read log: negative limit %d", ErrInvalidConfig, limit)
	}
	if err := checkFilter(q.EventTypes, "event type", projector.ErrInvalidEventType); err != nil {
		return LogBatch{}, fmt.Errorf("read log: %w", err)
	}
	if err := checkFilter(q.StreamTypes, "stream type", projector.ErrInvalidStream); err != nil {
		return LogBatch{}, fmt.Errorf("read log: %w", err)
	}
	if q.Partition.Bits > BucketBits || q.Partition.Value >= uint32(q.Partition.Count()) {
		return LogBatch{}, fmt.Errorf("read log: partition segment %d bits, value %d: want at most %d bits and a value below 2^bits", q.Partition.Bits, q.Partition.Value, BucketBits)
	}
	sql, args, merged := s.readLogQuery(q, limit)
	var batch LogBatch
	var err error
	if b, ok := db.(batcher); ok && merged {
		batch.Events, err = s.readMerged(ctx, b, sql, args, &batch.Horizon, q.Raw)
	} else {
		var rows pgx.Rows
		if rows, err = db.Query(ctx, sql, args...); err == nil {
			batch.Events, err = s.collectWithHorizon(ctx, db, rows, &batch.Horizon, q.Raw)
		}
	}
	if err != nil {
		return LogBatch{}, fmt.Errorf("read log after %s: %w", q.After, err)
	}
	batch.Full = len(batch.Events) == limit
	return batch, nil
}

// batcher is a DBTX that pipelines: a pool, a connection, a transaction.
type batcher interface {
	DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Planner settings the merged reads (a partition's, readLogPartitionSQL;
// a few types', readLogTypesSQL) run under, and put back after them.
//
// Each branch of such a read (a bucket of the partition index, or a type of
// the type index) must be an ordered walk of its index, merged lazily, so
// that a batch reads the events it returns. The planner chooses that only
// when it expects a branch to hold more events after the cursor than the
// batch takes; when it expects fewer (a log not analyzed yet, a bucket's
// share of a small or young log, a batch larger than a branch's estimate),
// a bitmap scan of the branch, sorted, and the branches appended and sorted
// again, look cheaper, and that plan reads every event of the partition (or
// of the types) after the cursor for each batch: a catch-up then costs the
// square of its backlog (issue 21: 4,573 rows read for a batch of 500 of a
// partition, 74 ms; the three types of the same benchmark's unpartitioned
// consumer planned the same way). Turning sorts and bitmap
// scans off for the statement leaves the ordered walks as its only plan
// without a sort. The settings are the transaction's own (set_config's
// is_local) and put back to what they were, before and after the read in
// the same round trip, so the caller's later statements (a pass's handlers)
// are planned as before.
//
// On an analyzed log that is not enough: with sorts off, a walk of the
// primary key, in the read's order, filtering out every event of the other
// buckets or types, can still look cheaper by page costs than the merged
// walks, and it reads the log from the cursor to the last event it returns
// (10,401 rows for a batch of 200 of three types on a log of 10,000
// events). With page costs at zero for the statement, each plan is costed
// by the rows it touches, and the merged walks, which touch the rows they
// return, win; the page costs are put back with the other settings.
//
// The same settings make the read's generic plan (plan_cache_mode): its
// shape no longer depends on the cursor or the limit, and planning it anew
// for each batch cost more than running it (a partition of 4 over 64
// buckets is 16 branches: 11–16 ms of planning against 4–5 ms of execution
// for a batch of 500, about 25 µs of the server's CPU per event). The
// generic plan is made once per connection and statement, where pgx caches
// the statement (its default mode); in the modes that prepare nothing
// (QueryExecModeExec, the simple protocol), each read is planned as before.
const (
	mergedPlanSaveSQL = `SELECT set_config('projector.read_plan', current_setting('enable_sort') || ' ' || current_setting('enable_bitmapscan') || ' ' || current_setting('plan_cache_mode')
		|| ' ' || current_setting('seq_page_cost') || ' ' || current_setting('random_page_cost'), true)`
	mergedPlanSetSQL = `SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),
		set_config('seq_page_cost', '0', true), set_config('random_page_cost', '0', true)`
	mergedPlanBackSQL = `SELECT set_config('enable_sort', split_part(current_setting('projector.read_plan'), ' ', 1), true),
		set_config('enable_bitmapscan', split_part(current_setting('projector.read_plan'), ' ', 2), true),
		set_config('plan_cache_mode', split_part(current_setting('projector.read_plan'), ' ', 3), true),
		set_config('seq_page_cost', split_part(current_setting('projector.read_plan'), ' ', 4), true),
		set_config('random_page_cost', split_part(current_setting('projector.read_plan'), ' ', 5), true)`
)

// readMerged runs a merged read (sql, args) under the planner settings
// above, in one round trip, and collects its events as collectWithHorizon
// does.
func (s *Store) readMerged(ctx context.Context, db batcher, sql string, args []any, horizon *uint64, raw bool) ([]projector.Event, error) {
	b := &pgx.Batch{}
	b.Queue(mergedPlanSaveSQL)
	b.Queue(mergedPlanSetSQL)
	b.Queue(sql, args...)
	b.Queue(mergedPlanBackSQL)
	br := db.SendBatch(ctx, b)
	var events []projector.Event
	var keys []rowKey
	var envs apartEnvelopes
	var epoch int64
	var err error
	if _, err = br.Exec(); err == nil {
		if _, err = br.Exec(); err == nil {
			var rows pgx.Rows
			if rows, err = br.Query(); err == nil {
				events, keys, envs, epoch, err = s.collectRows(rows, horizon, raw)
			}
			if err == nil {
				_, err = br.Exec()
			}
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil || !s.registry.HasPersonal() {
		return events, err
	}
	return s.openAndDecode(ctx, db, events, keys, envs, epoch, raw) // the connection is free again
}

// ArchivedAfter reports whether the archive holds an event after pos: a
// read from pos then needs [LogQuery.IncludeArchived] to see every event.
// One descent of the archive's position index. A registered consumer shard
// that is not disabled can trust a false answer while it holds its lock:
// `streams archive` moves only events every such shard has passed.
func (s *Store) ArchivedAfter(ctx context.Context, db DBTX, pos projector.Position) (bool, error) {
	var found bool
	if err := db.QueryRow(ctx, s.sql.archivedAfter, pos.TxID, pos.Seq).Scan(&found); err != nil {
		return false, fmt.Errorf("look for archived events after %s: %w", pos, err)
	}
	return found, nil
}

// checkFilter refuses a filter name PostgreSQL could not even compare (NUL
// bytes, invalid UTF-8) before it is sent: the driver's error would abort a
// caller's transaction. One longer than any stored name is refused too, as
// the CLI refuses it: it can match nothing, so it is a mistake (a 100 kB
// filter was sent and answered with nothing). A name that is merely unknown
// matches nothing and is fine.
func checkFilter(names []string, what string, sentinel error) error {
	for _, n := range names {
		if err := projector.ValidText(n); err != nil {
			return fmt.Errorf("%w: %s filter %s %w", sentinel, what, projector.Printable(n), err)
		}
		if len(n) > projector.MaxNameLength {
			// No stored name is longer: a filter that can match nothing
			// is a mistake, said rather than answered with nothing.
			return fmt.Errorf("%w: %s filter %s is %d bytes, over a name's limit of %d", sentinel, what, projector.Printable(n), len(n), projector.MaxNameLength)
		}
	}
	return nil
}

// readLogQuery is the statement and arguments of a log read: the
// partition's merge of its buckets, the per-type merge for a consumer of a
// few types, the filtered scan otherwise. merged says it is one of the
// merges (readMerged).
func (s *Store) readLogQuery(q LogQuery, limit int) (sql string, args []any, merged bool) {
	mode, keyArgs := s.readKeys()
	reads := &s.sql.read[mode]
	sql, logTypes, logPartition := reads.log, reads.logTypes, reads.logPartition
	if q.IncludeArchived {
		sql, logTypes, logPartition = reads.archived.log, reads.archived.logTypes, reads.archived.logPartition
	}
	types := q.EventTypes
	if q.Partition.Bits > 0 {
		return logPartition.get(int(q.Partition.Bits)), append([]any{q.After.TxID, q.After.Seq, limit, nilIfEmpty(distinct(types)), nilIfEmpty(q.StreamTypes), q.Partition.Buckets()[0]}, keyArgs...), true
	}
	if k := len(types); k > 0 && k <= maxMergedTypes {
		types = distinct(types)
		sql, merged = logTypes.get(len(types)-1), true
	}
	return sql, append([]any{q.After.TxID, q.After.Seq, limit, nilIfEmpty(types), nilIfEmpty(q.StreamTypes)}, keyArgs...), merged
}

// distinct returns names without repeats (a repeated type would be read
// twice by the per-type merge), allocating only when there are some.
func distinct(names []string) []string {
	for i := range names {
		if slices.Contains(names[:i], names[i]) {
			out := slices.Clone(names)
			slices.Sort(out)
			return slices.Compact(out)
		}
	}
	return names
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// row is one scanned event row, with nullable columns as pointers.
type row struct {
	txID          *uint64
	seq           *int64
	id            [16]byte // not uuid.UUID: pgx scans that through sql.Scanner, a slow path
	tenant        pgtype.DriverBytes
	streamType    pgtype.DriverBytes
	streamID      string
	version       int64
	typ           pgtype.DriverBytes
	schemaVersion int32
	// rawData and rawEnvelope are the row's payload and envelope as pgx
	// lends them, valid until the next row; own copies them to data and
	// envelope.
	rawData, rawEnvelope pgtype.DriverBytes
	data                 []byte
	correlation          [16]byte
	causation            *[16]byte
	actor                pgtype.DriverBytes
	headers              []byte
	recordedAt           time.Time
	envelope             []byte // an event envelope kept apart (migration 29), or nil: just before data, in one array
	key                  rowKey // a keyed read's key columns
	// names interns the few distinct tenants, stream types, event types and
	// actors of a read: one string each instead of one per row.
	names map[string]string
}

// rowColumns is the number of an event row's columns; a keyed read's rows
// have the key columns (keyColumns) after them.
const rowColumns = 16

// keyedColumns is the number of key columns a keyed read adds.
const keyedColumns = 4

func (r *row) dest(keyed bool) []any {
	d := []any{&r.txID, &r.seq, &r.id, &r.tenant, &r.streamType, &r.streamID, &r.version, &r.typ,
		&r.schemaVersion, &r.rawData, &r.correlation, &r.causation, &r.actor, &r.headers, &r.recordedAt, &r.rawEnvelope}
	if keyed {
		d = append(d, &r.key.subject, &r.key.keyID, &r.key.wrapped, &r.key.epoch)
	}
	return d
}

// own copies the scanned payload, and envelope if any, out of pgx's
// buffer: the envelope, then the payload, in one allocation, so a sealed
// read opens the payload over both (projector.Personal.
// OpenStoredApartByInPlace) with no allocation of its own, as it opens
// one with the envelope inside over the payload alone.
func (r *row) own() {
	if r.rawEnvelope == nil {
		r.data, r.envelope = bytes.Clone([]byte(r.rawData)), nil
		return
	}
	n := len(r.rawEnvelope)
	buf := make([]byte, n+len(r.rawData))
	copy(buf, r.rawEnvelope)
	copy(buf[n:], r.rawData)
	r.envelope, r.data = buf[:n], buf[n:]
}

// payload returns the row's payload as every reader takes it: with an
// event envelope kept apart (migration 29) put back in the field that
// holds its place, so opening, exporting and relaying are the same for
// both forms.
func (r *row) payload() ([]byte, error) {
	if r.envelope == nil {
		return r.data, nil
	}
	data, err := projector.AttachEnvelope(r.data, r.envelope)
	if err != nil {
		stream := projector.StreamRef{Tenant: string(r.tenant), Type: string(r.streamType), ID: r.streamID}
		return nil, fmt.Errorf("event %s (%s v%d of %s): %w", uuid.UUID(r.id), projector.Printable(string(r.typ)), r.version, stream, err)
	}
	return data, nil
}

// apartEnvelopes are the event envelopes kept apart (migration 29) of a
// read's events, which open with them where they are (OpenStoredApart)
// rather than put back in the payload as base64 only to be decoded again:
// one per event, nil for an event without one; nil while no event has one.
type apartEnvelopes [][]byte

// add records the envelope of event i, the events before it recorded.
func (a *apartEnvelopes) add(i int, env []byte) {
	if env == nil && *a == nil {
		return
	}
	if *a == nil {
		*a = make([][]byte, i, i+16)
	}
	*a = append(*a, env)
}

// of returns event i's envelope, or nil.
func (a apartEnvelopes) of(i int) []byte {
	if a == nil {
		return nil
	}
	return a[i]
}

// intern returns b as a string, the same string for equal bytes.
func (r *row) intern(b []byte) string {
	if s, ok := r.names[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if r.names == nil {
		r.names = map[string]string{}
	}
	s := string(b)
	r.names[s] = s
	return s
}

func (s *Store) collect(ctx context.Context, db DBTX, rows pgx.Rows, raw bool) ([]projector.Event, error) {
	return s.collectMarked(ctx, db, rows, raw, nil)
}

// collectMarked is collect for a read that may return readStreamSQL's
// archive marker, a row of NULLs: it sets *archived rather than being
// decoded. Any stream read may end with a readEpoch read's key epoch row
// (keyEpochRowSQL), whose tx_id is NULL and seq is not.
func (s *Store) collectMarked(ctx context.Context, db DBTX, rows pgx.Rows, raw bool, archived *bool) ([]projector.Event, error) {
	defer rows.Close()
	var out []projector.Event
	var keys []rowKey
	var envs apartEnvelopes
	var r row
	var epoch int64 // a readEpoch read's key epoch
	sealed := s.registry.HasPersonal()
	keyed := len(rows.FieldDescriptions()) == rowColumns+keyedColumns
	dest := r.dest(keyed)
	for rows.Next() {
		if v := rows.RawValues(); v[0] == nil {
			if v[1] != nil {
				if err := rows.Scan(epochDest(&epoch, 1, len(v))...); err != nil {
					return nil, err
				}
				continue
			}
			if archived != nil {
				*archived = true
				continue
			}
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		r.own()
		ev, err := s.decodeRow(&r, raw, sealed)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
		if keyed {
			keys = append(keys, r.key)
		}
		if sealed {
			envs.add(len(out)-1, r.envelope)
		}
	}
	if err := rows.Err(); err != nil || !sealed {
		return out, err
	}
	return s.openAndDecode(ctx, db, out, keys, envs, epoch, raw)
}

// epochDest is the scan destinations of a key epoch row of n columns: the
// epoch at column i, the others skipped.
func epochDest(epoch *int64, i, n int) []any {
	d := make([]any, n)
	d[i] = epoch
	return d
}

// openAndDecode opens the personal fields of events read without
// decoding, then decodes them. keys are the key rows a readKeyed read
// brought with the events (nil for other reads), envs the event envelopes
// kept apart from their payloads, epoch the key epoch a readEpoch read
// returned (0 for other reads): the keys neither gives are read in a
// statement of their own on the same connection.
func (s *Store) openAndDecode(ctx context.Context, db DBTX, events []projector.Event, keys []rowKey, envs apartEnvelopes, epoch int64, raw bool) ([]projector.Event, error) {
	if err := s.open(ctx, db, events, keys, envs, epoch); err != nil {
		return nil, err
	}
	for i := range events {
		if err := s.decodeEvent(&events[i], raw); err != nil {
			return nil, err
		}
	}
	return events, nil
}

// collectWithHorizon reads the log query's rows: the horizon in the first
// column, then an event, or NULLs when nothing matched, or, in a readEpoch
// read's last row (keyEpochLogRowSQL), NULL and the key epoch.
func (s *Store) collectWithHorizon(ctx context.Context, db DBTX, rows pgx.Rows, horizon *uint64, raw bool) ([]projector.Event, error) {
	out, keys, envs, epoch, err := s.collectRows(rows, horizon, raw)
	if err != nil || !s.registry.HasPersonal() {
		return out, err
	}
	return s.openAndDecode(ctx, db, out, keys, envs, epoch, raw)
}

// collectRows is collectWithHorizon's reading of rows, which it closes: the
// events, with their key rows and the read's key epoch when the registry
// has personal fields (their payloads then still sealed, for
// openAndDecode).
func (s *Store) collectRows(rows pgx.Rows, horizon *uint64, raw bool) ([]projector.Event, []rowKey, apartEnvelopes, int64, error) {
	defer rows.Close()
	sealed := s.registry.HasPersonal()
	keyed := len(rows.FieldDescriptions()) == 1+rowColumns+keyedColumns
	out := make([]projector.Event, 0, 64)
	var keys []rowKey
	var envs apartEnvelopes
	var r row
	var epoch int64
	dest := append([]any{horizon}, r.dest(keyed)...)
	onlyHorizon := make([]any, len(dest))
	onlyHorizon[0] = horizon
	for rows.Next() {
		if v := rows.RawValues(); v[1] == nil { // the outer join's empty side, or the epoch row
			d := onlyHorizon
			if v[2] != nil {
				d = epochDest(&epoch, 2, len(v))
				d[0] = horizon
			}
			if err := rows.Scan(d...); err != nil {
				return nil, nil, nil, 0, err
			}
			continue
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, nil, 0, err
		}
		r.own()
		ev, err := s.decodeRow(&r, raw, sealed)
		if err != nil {
			return nil, nil, nil, 0, err
		}
		out = append(out, ev)
		if keyed {
			keys = append(keys, r.key)
		}
		if sealed {
			envs.add(len(out)-1, r.envelope)
		}
	}
	return out, keys, envs, epoch, rows.Err()
}

// decodeRow assembles the row's event and decodes it, unless deferred: then
// the caller opens sealed fields first, with the row's envelope when it
// is kept apart (apartEnvelopes), and decodes with decodeEvent.
func (s *Store) decodeRow(r *row, raw, deferred bool) (projector.Event, error) {
	var causation *uuid.UUID
	if r.causation != nil {
		c := uuid.UUID(*r.causation)
		causation = &c
	}
	data := r.data
	if !deferred {
		var err error
		if data, err = r.payload(); err != nil {
			return projector.Event{}, err
		}
	}
	ev, err := DecodeEnvelope(r.txID, r.seq, r.id, projector.StreamRef{Tenant: r.intern(r.tenant), Type: r.intern(r.streamType), ID: r.streamID},
		r.version, r.intern(r.typ), int(r.schemaVersion), data, r.correlation, causation, r.intern(r.actor), r.headers, r.recordedAt)
	if err != nil || deferred {
		return ev, err
	}
	return ev, s.decodeEvent(&ev, raw)
}

// decodeEvent upcasts a stored event's data and, unless raw, decodes its
// payload.
func (s *Store) decodeEvent(ev *projector.Event, raw bool) error {
	if raw {
		// A refused upcast leaves the event at its stored schema version:
		// a raw read must not fail on one event (a dispatcher could not then
		// blame it, retry it or dead-letter it), and the version tells the
		// reader that Data is not in the current shape.
		if data, v, err := s.registry.Upcast(ev.Type, ev.SchemaVersion, ev.Data); err == nil {
			ev.Data, ev.SchemaVersion = data, v
		}
		return nil
	}
	// Opened: a read opens every sealed field of a type its registry
	// declares personal before it decodes (open), and with a registry
	// that declares none there is nothing for Decode's own check.
	payload, data, version, err := s.registry.DecodeOpened(ev.Type, ev.SchemaVersion, ev.Data)
	if err != nil {
		return fmt.Errorf("event %s (%s v%d of %s, schema version %d): %w", ev.ID, ev.Type, ev.Version, ev.Stream, ev.SchemaVersion, err)
	}
	ev.Payload, ev.Data, ev.SchemaVersion = payload, data, version
	return nil
}

// DecodeEnvelope assembles an event from stored columns, checking what the
// schema cannot: that there is data, and that headers, when present, are a
// JSON object of strings. It never panics, whatever the bytes (a fuzz test
// holds it to that).
func DecodeEnvelope(txID *uint64, seq *int64, id uuid.UUID, stream projector.StreamRef, version int64, typ string,
	schemaVersion int, data []byte, correlation uuid.UUID, causation *uuid.UUID, actor string, headers []byte, recordedAt time.Time,
) (projector.Event, error) {
	ev := projector.Event{
		ID: id, Stream: stream, Version: version, Type: typ, SchemaVersion: schemaVersion,
		Metadata: projector.Metadata{CorrelationID: correlation, Actor: actor}, RecordedAt: recordedAt,
	}
	if txID == nil || seq == nil {
		return ev, fmt.Errorf("%w: event %s has no log position", projector.ErrInvalidPayload, id)
	}
	ev.Position = projector.Position{TxID: *txID, Seq: *seq}
	if causation != nil {
		ev.Metadata.CausationID = *causation
	}
	if len(data) == 0 {
		return ev, fmt.Errorf("%w: event %s: no stored data", projector.ErrInvalidPayload, id)
	}
	// Data is not re-validated: jsonb only ever holds valid JSON, and
	// decoding the payload checks it anyway. pgx hands out a fresh slice.
	ev.Data = json.RawMessage(data)
	if len(headers) > 0 && string(headers) != "null" {
		if err := json.Unmarshal(headers, &ev.Metadata.Headers); err != nil {
			return ev, fmt.Errorf("%w: event %s: headers: %w", projector.ErrInvalidPayload, id, err)
		}
	}
	return ev, nil
}

// Horizon returns the position a reader starting now may begin at without
// missing anything still to come: just before the oldest transaction still
// running. Every event of a finished transaction sorts before it; some may
// have committed moments ago.
func (s *Store) Horizon(ctx context.Context) (projector.Position, error) {
	var xmin uint64
	if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())`).Scan(&xmin); err != nil {
		return projector.Position{}, fmt.Errorf("read horizon: %w", err)
	}
	return projector.Horizon(xmin), nil
}

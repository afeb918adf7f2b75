package benchmark

import (
	"strings"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

// HeadShapes returns the stream-head variants of issue 22's "no separate
// head row" avenue, each today's events table (LIKE projector_events
// INCLUDING ALL) written in one statement per append, the way an append
// would write it:
//
//   - events-with-head: the events and the stream head upsert of today's
//     append (one head row per stream, updated by every append, which holds
//     the version and the last transaction for promise 4) — Projector's
//     statement written by hand, so the rest of the comparison is tables,
//     not code.
//   - events-with-head-returning: events-with-head returning each event's
//     position and time, as the append must.
//   - events-append-statement: a copy of the append's own AnyVersion
//     statements and parameters (scalars for one event, four arrays for
//     more) run by tx.Exec, so the difference to Projector's side is the
//     store's Go path and nothing of the SQL.
//   - events-no-head: no head row. The stream's last event is read through
//     the per-stream unique index (a backward scan of one entry), the
//     transaction-order rule of promise 4 is checked against its tx_id, the
//     events are numbered from its version, and a concurrent appender of the
//     same version is caught by that index: ON CONFLICT DO NOTHING waits
//     for it and inserts nothing, which the append would retry or report
//     (a wait and then a retry, not an error, for any version).
//   - events-no-head-locked: events-no-head with an exclusive
//     transaction-scoped advisory lock on the stream in the same statement:
//     what keeps [postgres.Store.LockStream]'s promise that appends wait
//     for a stream's lock holders once no head row is there to lock.
//   - events-no-head-hash-id: events-no-head with the event id's unique
//     B-tree replaced by a hash index (PostgreSQL's hash indexes cannot be
//     unique, so the id's uniqueness would rest on UUIDv7 generation
//     alone).
//
// Each writer's streams are its own, so the statements never meet on a
// stream: these measure what each layout costs an uncontended append.
func HeadShapes() []RowShape {
	const insertCols = `(id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, causation_id, actor, headers)`
	// last is the stream's newest event through the unique key, or version
	// 0 for a new stream; no row when a younger transaction wrote it.
	// (MATERIALIZED: read once, not once per event of the nested loop.)
	const last = `SELECT coalesce(max(l.version), 0) AS version
			FROM (SELECT e.version, e.tx_id FROM {{t}} e
				WHERE e.tenant_id = $1 AND e.stream_type = $2 AND e.stream_id = $3
				ORDER BY e.version DESC LIMIT 1) l
			HAVING coalesce(max(l.tx_id), '0'::xid8) <= pg_current_xact_id()`
	const insert = `
		INSERT INTO {{t}} ` + insertCols + `
		SELECT ev.id, $1, $2, $3, head.version + ev.ord, $4, 1, ev.data, $5, NULL, '', NULL
		FROM head, unnest($6::uuid[], $7::jsonb[]) WITH ORDINALITY AS ev(id, data, ord)
		ORDER BY ev.ord
		ON CONFLICT (tenant_id, stream_type, stream_id, version) DO NOTHING`
	noHead := `WITH head AS MATERIALIZED (` + last + `)` + insert
	// The lock is taken in a CTE the last event's read joins, so before it.
	locked := `WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock(hashtextextended($2 || '/' || $3, 0))),
		head AS MATERIALIZED (` + strings.Replace(last, "FROM (SELECT", "FROM lk, (SELECT", 1) + `)` + insert
	args := func(w *shapeWriter) []any {
		return []any{projector.SystemTenant, "bench", w.stream, AppendedType, [16]byte(uuid.Must(uuid.NewV7())), w.ids, w.a.datas}
	}
	table := `CREATE TABLE {{t}} (LIKE {{events}} INCLUDING ALL)`
	heads := `CREATE TABLE {{h}} (
				tenant_id   text        NOT NULL,
				stream_type text        NOT NULL,
				stream_id   text        NOT NULL,
				version     bigint      NOT NULL,
				last_tx_id  xid8        NOT NULL,
				created_at  timestamptz NOT NULL DEFAULT now(),
				updated_at  timestamptz NOT NULL DEFAULT now(),
				PRIMARY KEY (tenant_id, stream_type, stream_id)) WITH (fillfactor = 80)`
	withHead := `WITH head AS (
					INSERT INTO {{h}} AS s (tenant_id, stream_type, stream_id, version, last_tx_id)
					VALUES ($1, $2, $3, $8, pg_current_xact_id())
					ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE
						SET version = s.version + $8, last_tx_id = pg_current_xact_id(), updated_at = now()
						WHERE s.last_tx_id <= pg_current_xact_id()
					RETURNING s.version)
				INSERT INTO {{t}} ` + insertCols + `
				SELECT ev.id, $1, $2, $3, head.version - $8 + ev.ord, $4, 1, ev.data, $5, NULL, '', NULL
				FROM head, unnest($6::uuid[], $7::jsonb[]) WITH ORDINALITY AS ev(id, data, ord)
				ORDER BY ev.ord`
	withHeadArgs := func(w *shapeWriter) []any { return append(args(w), int64(w.a.n)) }
	return []RowShape{
		{
			Name: "events-with-head", Doc: "today's events table and head upsert, one statement",
			DDL:    []string{table, heads},
			Insert: withHead,
			Args:   withHeadArgs,
		},
		{
			Name: "events-with-head-returning", Doc: "events-with-head returning each event's position and time, as the append does",
			DDL: []string{table, heads},
			Insert: withHead + `
				RETURNING tx_id, seq, version, recorded_at`,
			Args: withHeadArgs,
		},
		{
			Name: "events-append-statement", Doc: "today's tables written by a copy of the append's own statements (scalars for one event), through pgx as the shapes are",
			DDL: []string{table, heads},
			InsertFor: func(n int) string {
				if n == 1 {
					return appendStatementOne
				}
				return appendStatementMany
			},
			Args: appendStatementArgs,
		},
		{Name: "events-no-head", Doc: "today's events table; version and order checked against the stream's last event", DDL: []string{table}, Insert: noHead, Args: args},
		{
			Name: "events-no-head-locked", Doc: "events-no-head with an advisory lock on the stream",
			DDL:    []string{table},
			Insert: locked,
			Args:   args,
		},
		{
			Name: "events-no-head-hash-id", Doc: "events-no-head with a hash index on the event id instead of its unique B-tree",
			DDL: []string{`CREATE TABLE {{t}} (LIKE {{events}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING IDENTITY)`,
				`ALTER TABLE {{t}} ADD PRIMARY KEY (tx_id, seq), ADD UNIQUE (tenant_id, stream_type, stream_id, version)`,
				`CREATE INDEX ON {{t}} USING hash (id)`,
				`CREATE INDEX ON {{t}} (type, tx_id, seq)`,
				`CREATE INDEX ON {{t}} (stream_type, recorded_at)`},
			Insert: noHead, Args: args,
		},
	}
}

// IndexShapes returns today's events table with each of its secondary
// indexes taken away in turn, and with the primary key alone, written by
// the same hand-written insert as [RowShapes]' events-as-is: what each
// index costs an append of a few events, measured op by op
// ([MeasureShapesInterleaved]) where the slice-based figures of
// BenchmarkAppendSchemaCosts drown it in the commit's flush.
func IndexShapes() []RowShape {
	asIs := RowShapes()[0]
	indexes := []struct{ name, ddl string }{
		{"stream-key", `ALTER TABLE {{t}} ADD UNIQUE (tenant_id, stream_type, stream_id, version)`},
		{"event-id", `ALTER TABLE {{t}} ADD UNIQUE (id)`},
		{"type", `CREATE INDEX ON {{t}} (type, tx_id, seq)`},
		{"prune", `CREATE INDEX ON {{t}} (stream_type, recorded_at)`},
	}
	base := []string{`CREATE TABLE {{t}} (LIKE {{events}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY)`,
		`ALTER TABLE {{t}} ADD PRIMARY KEY (tx_id, seq)`}
	shapes := []RowShape{asIs}
	for skip, ix := range indexes {
		ddl := append([]string(nil), base...)
		for k, other := range indexes {
			if k != skip {
				ddl = append(ddl, other.ddl)
			}
		}
		shapes = append(shapes, RowShape{Name: "events-without-" + ix.name, Doc: "today's events table without its " + ix.name + " index",
			DDL: ddl, Insert: asIs.Insert, Args: asIs.Args})
	}
	// The event-id index as a hash (issue 22's index decision): a hash
	// index cannot be unique, so the one that keeps the promise is an
	// exclusion constraint over a hash index; the bare hash index is what
	// the constraint adds to.
	for _, id := range []struct{ name, doc, ddl string }{
		{"event-id-hash-exclusion", "today's events table with the event id unique through an exclusion constraint over a hash index",
			`ALTER TABLE {{t}} ADD EXCLUDE USING hash (id WITH =)`},
		{"event-id-hash", "today's events table with the event id in a hash index, not unique",
			`CREATE INDEX ON {{t}} USING hash (id)`},
	} {
		ddl := append([]string(nil), base...)
		for k, other := range indexes {
			if k != 1 {
				ddl = append(ddl, other.ddl)
			}
		}
		shapes = append(shapes, RowShape{Name: "events-" + id.name, Doc: id.doc, DDL: append(ddl, id.ddl), Insert: asIs.Insert, Args: asIs.Args})
	}
	return append(shapes, RowShape{Name: "events-primary-key-only", Doc: "today's events table with its primary key alone",
		DDL: base, Insert: asIs.Insert, Args: asIs.Args})
}

// appendStatementOne and appendStatementMany are copies of the append's
// AnyVersion statements (stores/postgres/sql.go) for a table {{t}} and heads
// {{h}}: one event as a row of scalar parameters, more as arrays.
const (
	appendStatementHead = `WITH head AS (
	INSERT INTO {{h}} AS s (tenant_id, stream_type, stream_id, version, last_tx_id)
	VALUES ($1, $2, $3, $4, pg_current_xact_id())
	ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE
		SET version = s.version + $4, last_tx_id = pg_current_xact_id(), updated_at = now()
		WHERE s.last_tx_id <= pg_current_xact_id()
	RETURNING s.version
)`
	appendStatementOne = appendStatementHead + `
INSERT INTO {{t}}
	(id, tenant_id, stream_type, stream_id, version, type, schema_version, data,
	 correlation_id, causation_id, actor, headers)
SELECT $5::uuid, $1, $2, $3, head.version, $6::text, $7::int, $8::jsonb, $9, $10, $11, $12
FROM head
RETURNING tx_id, seq, version, recorded_at`
	appendStatementMany = appendStatementHead + `
INSERT INTO {{t}}
	(id, tenant_id, stream_type, stream_id, version, type, schema_version, data,
	 correlation_id, causation_id, actor, headers)
SELECT ev.id, $1, $2, $3, (SELECT head.version FROM head) - $4 + ev.ord, ev.type, ev.sv, ev.data,
	$9, $10, $11, $12
FROM unnest($5::uuid[], $6::text[], $7::int[], $8::jsonb[]) WITH ORDINALITY AS ev(id, type, sv, data, ord)
WHERE (SELECT head.version FROM head) IS NOT NULL
ORDER BY ev.ord
RETURNING tx_id, seq, version, recorded_at`
)

// appendStatementArgs are the append's parameters, as the store passes
// them: scalars for one event, arrays for more.
func appendStatementArgs(w *shapeWriter) []any {
	a := w.a
	var causation *[16]byte
	var headers []byte
	args := []any{projector.SystemTenant, "bench", w.stream, int64(a.n)}
	if a.n == 1 {
		args = append(args, w.ids[0], a.types[0], a.versions[0], a.datas[0])
	} else {
		args = append(args, w.ids, a.types, a.versions, a.datas)
	}
	return append(args, [16]byte(uuid.Must(uuid.NewV7())), causation, "", headers)
}

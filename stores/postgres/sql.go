package postgres

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/projectorhq/projector"
)

// statements holds the fixed hot-path SQL with the schema filled in once.
type statements struct {
	append appendStatements
	// appendGuard checks the key guard alone ($1 the tenant, $2 and $3 the
	// subjects and wrapped keys), to tell a failed guard from a refused head.
	appendGuard string
	streamHead  string
	// read holds the reads of each readMode: without keys, with the
	// sealed events' key rows (keyJoinSQL), or with the key epoch alone
	// (keyEpochRowSQL).
	read          [3]readStatements
	restoredCheck string
	archivedAfter string
	pruneCount    string
	pruneChoose   string
	pruneDelete   string
}

// eventColumns are an event row's columns, in the events table's order
// (the archived reads take `SELECT *` of the hot table beside these of the
// archive's). envelope is the event envelope kept apart from the payload
// (migration 29), put back into it as each row is read (row.payload).
const eventColumns = `e.tx_id, e.seq, e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type,
	e.schema_version, e.data, e.correlation_id, e.causation_id, e.actor, e.headers, e.recorded_at, e.envelope`

// The append is one statement, one round trip whatever the number of events:
// a CTE that writes the stream's head, then the insert of the events, numbered
// from the head's new version. There is one statement per kind of expected
// version, per shape (one event or many) and per guard (none, or the key
// guard of an append sealed under cached keys: appendGuardSQL, or
// appendGuardOneSQL when they are one subject's) and per envelope (kept in
// the payload, or apart: appendEnvelope), thirty-six in all, so each
// plan holds
// only the head write that can apply: a statement with every branch paid for
// starting and running the ones that could not, and a single event paid for
// unnest, ORDINALITY and the sort of one row (docs/performance.md, "Single-event
// append").
//
// The head write is where both concurrency rules live. The expected version
// is checked against the row as it is after any concurrent writer committed
// (ON CONFLICT and UPDATE both re-check the row they waited for), and a
// transaction older than the one that last appended is refused
// (last_tx_id <= ours), so a stream's versions always sort the same way as
// its transaction ids (promise 4). A stream archived by `streams archive`
// (archived_at set) is refused the same way, and the refusal says so
// (ErrStreamArchived): the archive locks the head row, so an append either
// commits before the archive reads the stream's events or waits and is
// refused. A refused head returns no row, the event
// insert then inserts nothing, and the caller reads the head to report why.
//
// Parameters, the same in all: $1, $2, $3 the stream (tenant, type, id),
// $4 the number of events, $5–$8 the events' ids, types, schema versions and
// data (scalars for one event, arrays for many), $9–$12 the metadata
// (correlation, causation, actor, headers) and, for an exact expected
// version only, $13 that version; the guard's two follow, then the
// envelopes kept apart.

// appendAnyHead creates the stream or advances it, whatever its version.
const appendAnyHead = `
	INSERT INTO {{s}}.projector_streams AS s (tenant_id, stream_type, stream_id, version, last_tx_id)
	{{values}}
	ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE
		SET version = s.version + $4, last_tx_id = pg_current_xact_id(), updated_at = now()
		WHERE s.last_tx_id <= pg_current_xact_id() AND s.archived_at IS NULL
	RETURNING s.version`

// appendNoStreamHead creates the stream, or nothing when it exists. DO
// NOTHING still waits for a concurrent creator to finish, like DO UPDATE,
// but leaves the row it conflicts with unlocked.
const appendNoStreamHead = `
	INSERT INTO {{s}}.projector_streams AS s (tenant_id, stream_type, stream_id, version, last_tx_id)
	{{values}}
	ON CONFLICT (tenant_id, stream_type, stream_id) DO NOTHING
	RETURNING s.version`

// appendExactHead advances a stream that is at version $13; a stream that
// does not exist matches nothing.
const appendExactHead = `
	UPDATE {{s}}.projector_streams AS s
	SET version = s.version + $4, last_tx_id = pg_current_xact_id(), updated_at = now()
	WHERE s.tenant_id = $1 AND s.stream_type = $2 AND s.stream_id = $3
	  AND s.version = $13::bigint AND s.last_tx_id <= pg_current_xact_id() AND s.archived_at IS NULL{{guard}}
	RETURNING s.version`

// appendOneEvents inserts a single event, at the head's new version.
// {{ec}} and {{ev}} are the envelope's column and parameter in an append
// that keeps one apart (appendEnvelope), nothing in the others.
const appendOneEvents = `
INSERT INTO {{s}}.projector_events
	(id, tenant_id, stream_type, stream_id, version, type, schema_version, data,
	 correlation_id, causation_id, actor, headers{{ec}})
SELECT $5::uuid, $1, $2, $3, head.version, $6::text, $7::int, $8::jsonb, $9, $10, $11, $12{{ev}}
FROM head
RETURNING tx_id, seq, version, recorded_at`

// appendManyEvents inserts the events in order (ORDER BY ev.ord: seq, and
// so the log's order within the transaction, follows the versions; the
// function scan's ordinality is already in that order, so there is no
// sort). The head's version is read once, as an InitPlan, and a refused
// head (no row) stops the insert in a one-time filter: joined to the
// unnest instead (FROM head, unnest(…)), the plan rescanned the head's
// CTE once per event in a nested loop, 0.06–0.1 ms of a 100-event
// statement's 1.0–1.8 ms in EXPLAIN ANALYZE.
const appendManyEvents = `
INSERT INTO {{s}}.projector_events
	(id, tenant_id, stream_type, stream_id, version, type, schema_version, data,
	 correlation_id, causation_id, actor, headers{{ec}})
SELECT ev.id, $1, $2, $3, (SELECT head.version FROM head) - $4 + ev.ord, ev.type, ev.sv, ev.data,
	$9, $10, $11, $12{{eu}}
FROM unnest($5::uuid[], $6::text[], $7::int[], $8::jsonb[]{{ev}}) WITH ORDINALITY AS ev(id, type, sv, data, {{en}}ord)
WHERE (SELECT head.version FROM head) IS NOT NULL
ORDER BY ev.ord
RETURNING tx_id, seq, version, recorded_at`

// appendValues is the new head row of appendAnyHead and appendNoStreamHead.
const appendValues = `VALUES ($1, $2, $3, $4, pg_current_xact_id())`

// appendGuardSQL is the key guard of an append that sealed personal fields
// under keys from the process's cache (keyCache): true when every subject
// $%[1]d[i] of the stream's tenant still has the key row whose wrapped
// bytes are $%[2]d[i] — not forgotten, and committed (or this
// transaction's own). The guarded statements make the head write, and so
// the whole append, conditional on it: a failed guard writes nothing,
// returns no row, and the append starts over without the cache. A key row
// that holds lets the append go on locked FOR SHARE until it ends, as
// KeyTable.DataKey locks it: a forget waits for the append, so the fields
// an inline projection copied in the clear commit before the forget's
// OnForgotten runs, and it deletes them.
const appendGuardSQL = `NOT EXISTS (SELECT FROM unnest($%[1]d::text[], $%[2]d::bytea[]) AS g(subject, wrapped)
		WHERE NOT EXISTS (SELECT FROM {{s}}.projector_subject_keys k
			WHERE k.tenant_id = $1 AND k.subject = g.subject AND k.wrapped = g.wrapped FOR SHARE OF k))`

// appendGuardOneSQL is appendGuardSQL for an append whose sealed fields
// are all one subject's, the common case: one probe of the key table by
// its primary key, with the subject and wrapped bytes as scalars, where
// the general guard encodes two arrays and unnests them.
const appendGuardOneSQL = `EXISTS (SELECT FROM {{s}}.projector_subject_keys k
		WHERE k.tenant_id = $1 AND k.subject = $%[1]d::text AND k.wrapped = $%[2]d::bytea FOR SHARE OF k)`

// appendGuardedValues is appendValues when guarded: a row only when the
// guard holds.
const appendGuardedValues = `SELECT $1::text, $2::text, $3::text, $4::bigint, pg_current_xact_id() WHERE `

// appendStatements holds the append statements, by expected-version kind,
// shape, guard and envelope.
type appendStatements struct {
	// anyVersion, noStream and exact are indexed by envelope (appendPlain,
	// or appendEnvelope: an event envelope kept apart, in the parameter
	// after the last, a bytea or, for many events, a bytea[] with NULL
	// for the events that have none), guard (guardNone, or a key guard
	// taking the two parameters after the last: guardMany with arrays,
	// guardOne with one subject's scalars) and shape (0 for one event, 1
	// for more).
	anyVersion, noStream, exact [2][3][2]string
}

// The append statements' forms by envelope: 36 statements in all, so an
// append with no envelope apart (every plain append) sends and plans what
// it did before migration 29.
const (
	appendPlain    = iota
	appendEnvelope // an event envelope kept apart (Personal.EnvelopeApart)
)

// The append statements' key guards.
const (
	guardNone = iota // nothing sealed under a cached key
	guardMany        // appendGuardSQL: arrays of subjects and wrapped keys
	guardOne         // appendGuardOneSQL: one subject, scalars
)

func buildAppendStatements(r *strings.Replacer) appendStatements {
	both := func(head string, kind, envelope int, first int) [2]string {
		values, guard := appendValues, ""
		next := first // the envelope's parameter
		if kind != guardNone {
			g := fmt.Sprintf(appendGuardSQL, first, first+1)
			if kind == guardOne {
				g = fmt.Sprintf(appendGuardOneSQL, first, first+1)
			}
			values, guard = appendGuardedValues+g, "\n\t  AND "+g
			next += 2
		}
		head = strings.NewReplacer("{{values}}", values, "{{guard}}", guard).Replace(head)
		with := "WITH head AS (" + head + "\n)"
		env := strings.NewReplacer("{{ec}}", "", "{{ev}}", "", "{{eu}}", "", "{{en}}", "")
		if envelope == appendEnvelope {
			p := fmt.Sprintf("$%d", next)
			one := strings.NewReplacer("{{ec}}", ", envelope", "{{ev}}", ", "+p+"::bytea")
			many := strings.NewReplacer("{{ec}}", ", envelope", "{{eu}}", ", ev.envelope", "{{ev}}", ", "+p+"::bytea[]", "{{en}}", "envelope, ")
			return [2]string{r.Replace(one.Replace(with + appendOneEvents)), r.Replace(many.Replace(with + appendManyEvents))}
		}
		return [2]string{r.Replace(env.Replace(with + appendOneEvents)), r.Replace(env.Replace(with + appendManyEvents))}
	}
	var a appendStatements
	for e := range a.anyVersion {
		for g := range a.anyVersion[e] {
			a.anyVersion[e][g] = both(appendAnyHead, g, e, 13)
			a.noStream[e][g] = both(appendNoStreamHead, g, e, 13)
			a.exact[e][g] = both(appendExactHead, g, e, 14)
		}
	}
	return a
}

// statement returns the statement for n events with expectation expected,
// key guard g and envelope form e, and whether it takes the expected
// version as its parameter $13 (the guard's two follow it, then the
// envelopes).
func (a *appendStatements) statement(expected projector.ExpectedVersion, n int, g, e int) (sql string, takesVersion bool) {
	shape := 0
	if n > 1 {
		shape = 1
	}
	switch {
	case expected == projector.AnyVersion:
		return a.anyVersion[e][g][shape], false
	case expected == projector.NoStream:
		return a.noStream[e][g][shape], false
	default:
		return a.exact[e][g][shape], true
	}
}

const streamHeadSQL = `
SELECT version, last_tx_id, pg_current_xact_id_if_assigned(), archived_at IS NOT NULL
FROM {{s}}.projector_streams
WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3`

// readStreamSQL reads a stream's events in version order. A read from
// version 1 ($4) of an archived stream (`streams archive`: no events left in
// this table) returns instead one row of NULLs, the archive marker, from the
// stream's head in the same statement: an empty read from the start needs
// no second look at the head, and no event row carries an extra column.
const readStreamSQL = `
(SELECT ` + eventColumns + `{{kc}}
FROM {{s}}.projector_events e{{kj}}
WHERE e.tenant_id = $1 AND e.stream_type = $2 AND e.stream_id = $3
  AND e.version >= $4 AND e.version <= $5
  AND ($6::timestamptz IS NULL OR e.recorded_at <= $6::timestamptz)
ORDER BY e.version)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL{{kn}}
FROM {{s}}.projector_streams s
WHERE $4::bigint = 1 AND s.tenant_id = $1 AND s.stream_type = $2 AND s.stream_id = $3 AND s.archived_at IS NOT NULL{{ke}}`

// readLogSQL is the gap-safe read. The horizon is the oldest transaction
// still running (or this one, if it has an id: a dispatcher reading inside
// its own transaction must not move past the events it emits itself). Every
// transaction below the horizon has finished, so rows below it are final and
// reading them in (tx_id, seq) order never passes a row that commits later.
// The horizon is returned even when no row matches, in the same snapshot, so
// a consumer whose filter matched nothing can still move forward.
const readLogSQL = `
WITH h AS MATERIALIZED (
	SELECT LEAST(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned()) AS xmin
)
SELECT h.xmin, ` + eventColumns + `{{kc}}
FROM h LEFT JOIN LATERAL (
	SELECT * FROM {{s}}.projector_events e
	WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin
	  AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
	  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
	ORDER BY e.tx_id, e.seq
	LIMIT $3
) e ON true{{kj}}{{khe}}`

// readLogTypesSQL is readLogSQL for a consumer of a few event types, which
// would otherwise walk every event of every other type on its way (a scan
// of the primary key filtered by type: the cost of the events skipped, not
// of those returned). Each type is read in log order through the
// (type, tx_id, seq) index, with the same gap-safe bounds, and the ordered
// reads are merged (Merge Append): a batch costs the events it returns
// plus one index descent per type. The descent must land on the cursor, not
// on the type's first event: the branch says type = $4[i] and
// (tx_id, seq) > cursor, which the B-tree turns into the start key
// (type, tx_id, seq) > ($4[i], cursor). Written as one row comparison over
// (type, tx_id, seq) beside the equality, PostgreSQL 15 started every read
// at the equality and walked the type's every earlier index entry: a batch
// cost its position in the log, a catch-up the square of the log. %s
// stands for one branch per type, joined by UNION ALL; each takes its type
// as the array element $4[i].
const readLogTypesSQL = `
WITH h AS MATERIALIZED (
	SELECT LEAST(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned()) AS xmin
)
SELECT h.xmin, ` + eventColumns + `{{kc}}
FROM h LEFT JOIN LATERAL (
	SELECT * FROM (%s) u ORDER BY u.tx_id, u.seq LIMIT $3
) e ON true{{kj}}{{khe}}`

// readLogTypeBranch is one type's ordered read in readLogTypesSQL.
const readLogTypeBranch = `(SELECT * FROM {{s}}.projector_events e
		WHERE e.type = ($4::text[])[%[1]d] AND (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin
		  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
		ORDER BY e.tx_id, e.seq LIMIT $3)`

// readLogPartitionSQL is readLogSQL for one partition of a partitioned
// consumer (a hash segment, see Segment). Each bucket of the segment is read
// in log order through the (projector_stream_bucket(...), tx_id, seq) index
// (PartitionIndex, created on demand: see Store.CreatePartitionIndex)
// with the same gap-safe bounds, and the ordered reads are merged (Merge
// Append, which pulls lazily): a batch costs the events it returns plus one
// index descent per bucket, and never walks another partition's rows. The
// bucket is the first index column and an equality, so, as in
// readLogTypesSQL, the descent starts at (bucket, cursor). Event and stream
// type filters are applied to the partition's rows. %s stands for one branch
// per bucket, joined by UNION ALL; $6 is the segment's first bucket.
const readLogPartitionSQL = readLogTypesSQL

// A read of a registry with personal fields, whose keys are the store's
// key table, takes one of two forms (readMode), both one statement, one
// round trip and one snapshot:
//
//   - readKeyed (keyColumns, keyJoinSQL), while the process has seen no key
//     epoch (migration 26) yet: each sealed event brings its key row. For an
//     event of a personal type ($%[1]d[i], its subject field $%[2]d[i]) the
//     join finds the key row of the subject the event names and returns
//     that subject (sparing the client a scan of the payload for it);
//     subject and master_key_id are NULL when there is no key row at all,
//     wrapped NULL when the subject was forgotten. Events of other types
//     find nothing (array_position is NULL). The wrapped bytes are unwrapped
//     in Go, or taken from the cache when it holds that very row
//     (keyCache): a key forgotten before the read's snapshot is never used.
//     The last column is the key epoch of the read's snapshot, an InitPlan
//     read once per statement.
//   - readEpoch (keyEpochRowSQL, keyEpochLogRowSQL), once it has: the
//     events as a plain read returns them, and one more row, after them,
//     that carries only the key epoch of the read's snapshot. The client
//     opens each sealed event with the key it cached if a read saw the
//     subject's key row at that very epoch (no key was destroyed since,
//     keyCache), and reads the other subjects' keys in one statement of
//     their own, once per subject. A sealed row is then the size of a
//     plain one plus its envelope: no key columns, no join, no per-row
//     epoch, no key parameters. Measured on 100 events (docs/performance.md,
//     "Personal fields"), those cost about a quarter of the statement.
//
// LIMIT 1 (the key is unique anyway) keeps PostgreSQL from flattening the
// lateral subquery into a join: flattened, it probed the key table by
// tenant alone and filtered every key of the tenant against the subject,
// extracted from each event's jsonb again for each key — 4.6 ms for 100
// events of 100 subjects, where the probe by primary key takes 0.2 ms.
const keyColumns = `, k.subject, k.master_key_id, k.wrapped, (SELECT ep.epoch FROM {{s}}.projector_key_epoch ep)`

const keyJoinSQL = `
LEFT JOIN LATERAL (
	SELECT k.subject, k.master_key_id, k.wrapped FROM {{s}}.projector_subject_keys k
	WHERE k.tenant_id = e.tenant_id
	  AND k.subject = e.data ->> (($%[2]d::text[])[array_position($%[1]d::text[], e.type)])
	LIMIT 1
) k ON true`

// keyEpochRowSQL ends a stream read of readEpoch: a row whose tx_id is NULL
// (as the archive marker's) and whose seq is the key epoch. A stream read's
// rows are an event's columns; an event always has a tx_id.
const keyEpochRowSQL = `
UNION ALL
SELECT NULL, ep.epoch, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM {{s}}.projector_key_epoch ep`

// keyEpochLogRowSQL ends a log read of readEpoch: the horizon, then a row
// whose tx_id is NULL (as the empty side of the outer join) and whose seq
// is the key epoch.
const keyEpochLogRowSQL = `
UNION ALL
SELECT h.xmin, NULL, ep.epoch, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM h, {{s}}.projector_key_epoch ep`

// readMode is the form of a read: readPlain without keys, readKeyed with
// each sealed event's key row, readEpoch with the key epoch alone.
type readMode int

const (
	readPlain readMode = iota
	readKeyed
	readEpoch
)

// withKeys fills in a read's key placeholders for mode: readKeyed's key
// columns and join, its parameters first and first+1; readEpoch's epoch
// row; nothing for readPlain.
func withKeys(sql string, mode readMode, first int) string {
	switch mode {
	case readKeyed:
		return strings.NewReplacer("{{kc}}", keyColumns, "{{kj}}", fmt.Sprintf(keyJoinSQL, first, first+1),
			"{{kn}}", ", NULL, NULL, NULL, NULL", "{{ke}}", "", "{{khe}}", "").Replace(sql)
	case readEpoch:
		return strings.NewReplacer("{{kc}}", "", "{{kj}}", "", "{{kn}}", "", "{{ke}}", keyEpochRowSQL, "{{khe}}", keyEpochLogRowSQL).Replace(sql)
	default:
		return strings.NewReplacer("{{kc}}", "", "{{kj}}", "", "{{kn}}", "", "{{ke}}", "", "{{khe}}", "").Replace(sql)
	}
}

// readLogPartitionBranch is one bucket's ordered read in readLogPartitionSQL.
const readLogPartitionBranch = `(SELECT * FROM {{s}}.projector_events e
		WHERE {{s}}.projector_stream_bucket(e.tenant_id, e.stream_type, e.stream_id) = $6::smallint + %[1]d::smallint
		  AND (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin
		  AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
		  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
		ORDER BY e.tx_id, e.seq LIMIT $3)`

// The archived reads (LogQuery.IncludeArchived) are readLogSQL,
// readLogTypesSQL and readLogPartitionSQL over the hot log and the archive
// (projector_events_archive) together: each table read in log order with
// the same gap-safe bounds, up to a batch, and the ordered reads merged. It
// is one statement, so one snapshot: an archive or unarchive batch moves a
// stream's rows between the tables in one transaction, which the read sees
// as committed or not, so no event is read twice or missed (archived
// events keep their positions). The hot log's branches are the hot reads'
// own; the archive's walk its (tx_id, seq) index (migration 23), its
// (type, tx_id, seq) index per type (migration 25), or, for a partition,
// its (tx_id, seq) index filtered by bucket (the archive has no bucket
// index: a partition's read there walks the other partitions' archived
// events above its cursor, a cost paid once per catch-up).

// readLogArchivedSQL is readLogSQL with the archive. %s is the archive's
// branch, readLogArchiveBranch.
const readLogArchivedSQL = `
WITH h AS MATERIALIZED (
	SELECT LEAST(pg_snapshot_xmin(pg_current_snapshot()), pg_current_xact_id_if_assigned()) AS xmin
)
SELECT h.xmin, ` + eventColumns + `{{kc}}
FROM h LEFT JOIN LATERAL (
	SELECT * FROM ((SELECT * FROM {{s}}.projector_events e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin
		  AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
		  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
		ORDER BY e.tx_id, e.seq LIMIT $3)
	UNION ALL %s) u ORDER BY u.tx_id, u.seq LIMIT $3
) e ON true{{kj}}{{khe}}`

// readLogArchiveBranch is the archive's ordered read in readLogArchivedSQL
// and, with a bucket filter in %[1]s, in a partition's archived read.
const readLogArchiveBranch = `(SELECT ` + eventColumns + ` FROM {{s}}.projector_events_archive e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin%[1]s
		  AND ($4::text[] IS NULL OR e.type = ANY($4::text[]))
		  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
		ORDER BY e.tx_id, e.seq LIMIT $3)`

// readLogArchiveTypeBranch is one type's ordered read of the archive in
// readLogTypesSQL's archived form, through (type, tx_id, seq).
const readLogArchiveTypeBranch = `(SELECT ` + eventColumns + ` FROM {{s}}.projector_events_archive e
		WHERE e.type = ($4::text[])[%[1]d] AND (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < h.xmin
		  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
		ORDER BY e.tx_id, e.seq LIMIT $3)`

// readLogArchiveBucketFilter keeps a partition's buckets ($6 on, as many
// as %d) in readLogArchiveBranch.
const readLogArchiveBucketFilter = `
		  AND {{s}}.projector_stream_bucket(e.tenant_id, e.stream_type, e.stream_id) BETWEEN $6::smallint AND $6::smallint + %d::smallint`

// archivedAfterSQL says whether the archive holds an event after a
// position ($1, $2): its last event, one backward descent of its (tx_id,
// seq) index, compared with the position. (An EXISTS of a row after the
// position may be planned as a scan of the archive, expecting an early
// hit; there is none when the position is past the archive.)
const archivedAfterSQL = `SELECT EXISTS (SELECT 1 FROM (SELECT a.tx_id, a.seq FROM {{s}}.projector_events_archive a ORDER BY a.tx_id DESC, a.seq DESC LIMIT 1) m
	WHERE (m.tx_id, m.seq) > ($1::xid8, $2::bigint))`

// restoredCheckSQL finds the newest stored transaction id: of an event, or
// of a consumer's cursor or failing event. Cursors matter on their own: an
// idle cursor rests at a horizon (xmin-1, max) past the newest event, so a
// restore into a cluster whose next id falls between the two would pass a
// check of the events alone and then skip new events silently. Stream heads
// and dead letters are left out: a seq scan of every stream at start-up is
// not worth it, and neither can hide an event (the repair covers them).
// The archive counts like the hot table: with every stream archived the
// hot table is empty, and new events would sort before the archived ones
// in the reads that take both (rebuilds, exports with the archive).
const restoredCheckSQL = `
SELECT GREATEST((SELECT max(tx_id) FROM {{s}}.projector_events),
	(SELECT max(tx_id) FROM {{s}}.projector_events_archive),
	(SELECT max(GREATEST(cursor_tx_id, failed_tx_id)) FROM {{s}}.projector_consumers)),
	pg_snapshot_xmax(pg_current_snapshot())`

func buildStatements(schema string) statements {
	r := strings.NewReplacer("{{s}}", schema)
	return statements{
		append:        buildAppendStatements(r),
		appendGuard:   r.Replace("SELECT " + fmt.Sprintf(appendGuardSQL, 2, 3)),
		streamHead:    r.Replace(streamHeadSQL),
		read:          [3]readStatements{buildReadStatements(r, readPlain), buildReadStatements(r, readKeyed), buildReadStatements(r, readEpoch)},
		restoredCheck: r.Replace(restoredCheckSQL),
		archivedAfter: r.Replace(archivedAfterSQL),
		pruneCount:    r.Replace(pruneCountSQL),
		pruneChoose:   r.Replace(pruneChooseSQL),
		pruneDelete:   r.Replace(pruneDeleteSQL),
	}
}

// readStatements are the stream and log reads, with or without keys.
type readStatements struct {
	stream string
	log    string
	// logTypes.get(k-1) is readLogTypesSQL for k event types.
	logTypes *lazyStatements
	// logPartition.get(b) is readLogPartitionSQL for a segment of b bits.
	logPartition *lazyStatements
	// archived holds the same reads over the hot log and the archive
	// (LogQuery.IncludeArchived).
	archived struct {
		log          string
		logTypes     *lazyStatements
		logPartition *lazyStatements
	}
}

// lazyStatements builds each of a family of statements the first time it
// is asked for, and keeps it. The per-type and per-segment reads come in
// hundreds of variants (up to maxMergedTypes types, each up to twice as
// many branches, in three key modes, with and without the archive) of
// which a process runs the few its consumers' type lists and partitions
// need; built up front, they cost every [New] ~17 ms and 16 MB of
// garbage (~100 ms under the race detector), paid by every CLI command and
// every store a test makes.
type lazyStatements struct {
	build func(i int) string
	built []atomic.Pointer[string]
}

func newLazyStatements(n int, build func(i int) string) *lazyStatements {
	return &lazyStatements{build: build, built: make([]atomic.Pointer[string], n)}
}

// get returns statement i, building it on first use. Two goroutines
// asking at once may both build it; they build the same text, and either
// is kept.
func (l *lazyStatements) get(i int) string {
	if p := l.built[i].Load(); p != nil {
		return *p
	}
	sql := l.build(i)
	l.built[i].Store(&sql)
	return sql
}

// readKeyed's key parameters follow each read's own: $7–$8 for a stream
// read, $6–$7 for a log read, $7–$8 for a partition's.
func buildReadStatements(r *strings.Replacer, mode readMode) readStatements {
	rs := readStatements{
		stream:       r.Replace(withKeys(readStreamSQL, mode, 7)),
		log:          r.Replace(withKeys(readLogSQL, mode, 6)),
		logTypes:     readLogTypesStatements(r, mode, 6, false),
		logPartition: readLogPartitionStatements(r, mode, 7, false),
	}
	rs.archived.log = r.Replace(withKeys(fmt.Sprintf(readLogArchivedSQL, fmt.Sprintf(readLogArchiveBranch, "")), mode, 6))
	rs.archived.logTypes = readLogTypesStatements(r, mode, 6, true)
	rs.archived.logPartition = readLogPartitionStatements(r, mode, 7, true)
	return rs
}

// maxMergedTypes bounds the per-type merge: a consumer of more types than
// this reads most of the log anyway, and the filtered scan serves it.
const maxMergedTypes = 32

// readLogTypesStatements builds readLogTypesSQL for 1 to maxMergedTypes
// types; archived adds each type's read of the archive.
func readLogTypesStatements(r *strings.Replacer, mode readMode, keys int, archived bool) *lazyStatements {
	return newLazyStatements(maxMergedTypes, func(i int) string {
		k := i + 1
		branches := make([]string, 0, 2*k)
		for i := range k {
			branches = append(branches, fmt.Sprintf(readLogTypeBranch, i+1))
		}
		if archived {
			for i := range k {
				branches = append(branches, fmt.Sprintf(readLogArchiveTypeBranch, i+1))
			}
		}
		return r.Replace(withKeys(fmt.Sprintf(readLogTypesSQL, strings.Join(branches, "\n\tUNION ALL ")), mode, keys))
	})
}

// readLogPartitionStatements builds readLogPartitionSQL for segments of 1
// to BucketBits bits; archived adds the segment's read of the archive.
func readLogPartitionStatements(r *strings.Replacer, mode readMode, keys int, archived bool) *lazyStatements {
	return newLazyStatements(BucketBits+1, func(b int) string {
		n := 1 << (BucketBits - b)
		branches := make([]string, n, n+1)
		for i := range branches {
			branches[i] = fmt.Sprintf(readLogPartitionBranch, i)
		}
		if archived {
			branches = append(branches, fmt.Sprintf(readLogArchiveBranch, fmt.Sprintf(readLogArchiveBucketFilter, n-1)))
		}
		return r.Replace(withKeys(fmt.Sprintf(readLogPartitionSQL, strings.Join(branches, "\n\tUNION ALL ")), mode, keys))
	})
}

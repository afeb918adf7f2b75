package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
)

// RepairTxID is the transaction id [RepairRestoredCluster] gives every
// event. It is PostgreSQL's FrozenTransactionId: normal transaction ids
// start at 3 in every cluster and every epoch, so every transaction that
// will ever run sorts after it, and it is above 0, which [projector.Start]
// uses.
const RepairTxID uint64 = 2

// DefaultRepairLockTimeout is how long a repair waits for Projector's tables
// unless told otherwise: long enough for a last batch to finish, short
// enough that a forgotten dispatcher shows up as an error, not a hang.
const DefaultRepairLockTimeout = 10 * time.Second

// ErrNotRestored means the repair found nothing to repair: no stored
// transaction id is at or past the server's next one, so new events already
// sort after every stored one. It also matches
// [projector.ErrInvalidTransition]: like a refused ops transition, the
// repair is not allowed in the database's current state and nothing changed
// (the CLI exits 3).
var ErrNotRestored error = refusal("projector: database does not need a restored-cluster repair")

// ErrRepairBusy means the repair could not lock Projector's tables in time:
// some session (a dispatcher, the application, an open psql transaction) is
// still using them. Nothing changed.
var ErrRepairBusy = errors.New("projector: Projector's tables are in use")

// refusal is a sentinel that also matches projector.ErrInvalidTransition.
type refusal string

func (r refusal) Error() string { return string(r) }

func (refusal) Is(target error) bool { return target == projector.ErrInvalidTransition }

// RepairOptions says how to run [RepairRestoredCluster].
type RepairOptions struct {
	// DryRun carries out the whole repair, its checks included, and rolls
	// it back: the report says exactly what a real run would do (and the run
	// takes as long and locks the same tables), and nothing changes.
	DryRun bool
	// Force repairs even when the check finds no transaction id from the
	// future. Renumbering a healthy log keeps its order and every cursor
	// exactly, but it rewrites every event row, so it is never done by
	// accident.
	Force bool
	// LockTimeout bounds the wait for Projector's tables; zero means
	// [DefaultRepairLockTimeout].
	LockTimeout time.Duration
}

// RepairReport is what a repair did, or in a dry run would do.
type RepairReport struct {
	Schema string
	DryRun bool
	// Restored reports what the check found: a stored transaction id at or
	// past the server's next one. It is false only when Force repaired a
	// database that did not need it.
	Restored bool
	// NewestTxID is the newest transaction id stored in the schema and
	// NewestIn the column it was found in ("" when nothing is stored).
	NewestTxID uint64
	NewestIn   string
	// NextTxID is the server's next transaction id (pg_snapshot_xmax).
	NextTxID uint64
	// Events counts the renumbered events, now at positions
	// (RepairTxID, 1) … (RepairTxID, Events) in their old order.
	Events int64
	// Streams counts stream heads whose last_tx_id became RepairTxID.
	Streams int64
	// DeadLetters counts dead letters whose event position was remapped.
	DeadLetters int64
	// Consumers has one entry per consumer shard, by name and instance.
	Consumers []ConsumerRepair
}

// ConsumerRepair is how the repair moved one consumer shard.
type ConsumerRepair struct {
	Consumer, Instance, Status string
	// OldCursor and NewCursor select the same events: those after the new
	// cursor are exactly those that were after the old one.
	OldCursor, NewCursor projector.Position
	// OldFailedAt and NewFailedAt are the position of the event the shard
	// is failing on; zero when none is.
	OldFailedAt, NewFailedAt projector.Position
	// Behind counts the events after the cursor, the same before and after.
	Behind int64
	// SeesAgain counts events the shard had processed that now sort after
	// its cursor and will be delivered again. The mapping is exact, so it is
	// 0: the repair checks the events on both sides of every new cursor and
	// rolls back rather than commit a cursor that would skip or replay.
	SeesAgain int64
}

// RepairRestoredCluster makes a schema restored from a pg_dump into a
// different cluster usable again. Its stored transaction ids came from the
// old cluster and may be ahead of this one's, so new events would sort
// before old ones and consumers past them would never see them; [New]
// refuses to start on such a schema with [ErrRestoredDatabase]. It is a
// function rather than a [Store] method for that reason.
//
// In one transaction, holding every table that stores a log position in
// ACCESS EXCLUSIVE mode, it renumbers the log in its existing order: the
// event of rank r in the old (tx_id, seq) order moves to (RepairTxID, r).
// RepairTxID is below every transaction id this server will ever hand out,
// so new events sort after all of them. Every stored position moves with its event: a consumer
// cursor to the rank of the last event at or before it (Start stays Start),
// so the events after it are exactly those that were after it before,
// whether it pointed at an event, between events, past the end, or at an
// event since pruned; failing-event and dead-letter positions to their
// event's new position. Stream heads get last_tx_id = RepairTxID, so the
// per-stream order check (promise 4) lets new transactions append. The
// snapshots table stores stream versions, not log positions, and is not
// touched.
//
// Stop every dispatcher and writer first: the repair waits at most
// opts.LockTimeout for the tables and fails with [ErrRepairBusy]. It
// refuses with [ErrNotRestored] when no stored id is at or past the
// server's next one, unless opts.Force. The role running it must own the
// events table (it switches seq's identity mode for the update). Any
// failure rolls everything back; the report then holds only what the check
// found (NewestTxID, NextTxID), which a refusal's caller may want to show.
func RepairRestoredCluster(ctx context.Context, db DB, schema string, opts RepairOptions) (RepairReport, error) {
	schema = schemaOrDefault(schema)
	rep := RepairReport{Schema: schema, DryRun: opts.DryRun}
	if err := ValidateSchema(schema); err != nil {
		return rep, fmt.Errorf("repair restored cluster: %w", err)
	}
	if opts.LockTimeout < 0 {
		return rep, fmt.Errorf("repair restored cluster: negative lock timeout %v", opts.LockTimeout)
	}
	if err := requireMigrated(ctx, db, schema); err != nil {
		return rep, fmt.Errorf("repair restored cluster: %w", err)
	}
	r := &repair{opts: opts, rep: &rep, q: newRepairSQL(quoteIdent(schema))}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		r.tx = tx
		if err := r.run(ctx); err != nil {
			return err
		}
		if opts.DryRun {
			return errDryRun
		}
		return nil
	})
	if err != nil && !errors.Is(err, errDryRun) {
		// Nothing changed, so the report keeps only what the check found.
		found := RepairReport{Schema: rep.Schema, DryRun: rep.DryRun, Restored: rep.Restored,
			NewestTxID: rep.NewestTxID, NewestIn: rep.NewestIn, NextTxID: rep.NextTxID}
		return found, fmt.Errorf("repair restored cluster in schema %q: %w", schema, err)
	}
	return rep, nil
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("dry run")

func requireMigrated(ctx context.Context, db DB, schema string) error {
	status, err := MigrationStatus(ctx, db, schema)
	if err != nil {
		return err
	}
	var pending []int
	for _, m := range status {
		if !m.Applied() {
			pending = append(pending, m.Version)
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%w: schema %q lacks migrations %v; run `projector migrate up` first", ErrSchemaOutdated, schema, pending)
	}
	return nil
}

type repair struct {
	opts RepairOptions
	rep  *RepairReport
	q    repairSQL
	tx   pgx.Tx
}

func (r *repair) run(ctx context.Context) error {
	if err := r.lock(ctx); err != nil {
		return err
	}
	if err := r.check(ctx); err != nil {
		return err
	}
	// The map holds every event's old position and its rank in the old
	// order; every position in the schema is translated through it.
	for _, sql := range r.q.buildMap {
		if _, err := r.tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("map the log: %w", err)
		}
	}
	if err := r.tx.QueryRow(ctx, r.q.countMap).Scan(&r.rep.Events); err != nil {
		return fmt.Errorf("map the log: %w", err)
	}
	if err := r.renumberEvents(ctx); err != nil {
		return err
	}
	if err := r.remapConsumers(ctx); err != nil {
		return err
	}
	for _, q := range []string{r.q.remapReplays, r.q.remapRebuilds, r.q.remapArchive, r.q.remapHolds} {
		if _, err := r.tx.Exec(ctx, q, RepairTxID); err != nil {
			return fmt.Errorf("remap rebuild positions: %w", err)
		}
	}
	tag, err := r.tx.Exec(ctx, r.q.remapDeadLetters, RepairTxID)
	if err != nil {
		return fmt.Errorf("remap dead letters: %w", err)
	}
	r.rep.DeadLetters = tag.RowsAffected()
	if tag, err = r.tx.Exec(ctx, r.q.resetStreams, RepairTxID); err != nil {
		return fmt.Errorf("reset stream heads: %w", err)
	}
	r.rep.Streams = tag.RowsAffected()
	if err := r.verify(ctx); err != nil {
		return err
	}
	// setval is not transactional, so a dry run leaves the sequence alone.
	// Renumbered seqs never exceed the number of events, which the restored
	// sequence is already past; this only makes sure.
	if !r.opts.DryRun && r.rep.Events > 0 {
		if _, err := r.tx.Exec(ctx, r.q.raiseSequence, r.rep.Events, r.q.events); err != nil {
			return fmt.Errorf("raise the seq sequence: %w", err)
		}
	}
	return nil
}

// lock takes every table that holds a log position, exclusively, so no
// dispatcher or writer can interleave. The order is the one a dispatcher
// takes them in (consumers, then the log), which an append (streams, then
// events) also agrees with.
func (r *repair) lock(ctx context.Context) error {
	timeout := cmp.Or(r.opts.LockTimeout, DefaultRepairLockTimeout)
	if _, err := r.tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1))); err != nil {
		return fmt.Errorf("set lock timeout: %w", err)
	}
	if _, err := r.tx.Exec(ctx, r.q.lock); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") {
			return fmt.Errorf("%w: could not lock them within %v (%s); stop every dispatcher and application process on this schema, then run the repair again",
				ErrRepairBusy, timeout, pgErr.Message)
		}
		return fmt.Errorf("lock Projector's tables: %w", err)
	}
	return nil
}

// check refuses unless some stored transaction id is at or past the
// server's next one, the only state in which new events could sort before
// stored positions.
func (r *repair) check(ctx context.Context) error {
	var xmin uint64
	newest := make([]*uint64, len(positionColumns))
	dest := []any{&xmin, &r.rep.NextTxID}
	for i := range newest {
		dest = append(dest, &newest[i])
	}
	if err := r.tx.QueryRow(ctx, r.q.check).Scan(dest...); err != nil {
		return fmt.Errorf("read stored transaction ids: %w", err)
	}
	for i, n := range newest { // on a tie, the first column (the log) names it
		if n != nil && (r.rep.NewestIn == "" || *n > r.rep.NewestTxID) {
			r.rep.NewestTxID, r.rep.NewestIn = *n, positionColumns[i]
		}
	}
	if xmin <= RepairTxID { // cannot happen: xmin is a normal transaction id
		return fmt.Errorf("server's oldest running transaction %d is not above %d", xmin, RepairTxID)
	}
	r.rep.Restored = r.rep.NewestIn != "" && r.rep.NewestTxID >= r.rep.NextTxID
	if !r.rep.Restored && !r.opts.Force {
		if r.rep.NewestIn == "" {
			return fmt.Errorf("%w: schema %q stores no transaction ids; nothing changed", ErrNotRestored, r.rep.Schema)
		}
		return fmt.Errorf("%w: the newest stored transaction id, %d in %s, is below this server's next transaction id %d "+
			"(the check: newest stored id >= pg_snapshot_xmax(pg_current_snapshot())), so new events already sort after every stored one; "+
			"nothing changed. Repair anyway with --force (RepairOptions.Force)",
			ErrNotRestored, r.rep.NewestTxID, r.rep.NewestIn, r.rep.NextTxID)
	}
	return nil
}

// renumberEvents moves every event to (RepairTxID, rank). The primary key
// (tx_id, seq) is checked row by row during the update, so a target must
// never be a position another row still holds: when no event is at
// RepairTxID yet (every restored log) no target can be, and a single pass
// does; otherwise (a forced second repair) the rows pass through negative
// seqs, which no row ever has.
func (r *repair) renumberEvents(ctx context.Context) error {
	var atTarget bool
	if err := r.tx.QueryRow(ctx, r.q.anyAtTarget, RepairTxID).Scan(&atTarget); err != nil {
		return fmt.Errorf("renumber events: %w", err)
	}
	updates := []string{r.q.renumber}
	if atTarget {
		updates = []string{r.q.renumberNegative, r.q.flipNegative}
	}
	// seq is GENERATED ALWAYS, which refuses an UPDATE to anything but
	// DEFAULT; the mode is switched back before the transaction ends.
	if _, err := r.tx.Exec(ctx, r.q.generatedByDefault); err != nil {
		return fmt.Errorf("renumber events: %w", err)
	}
	for _, sql := range updates {
		tag, err := r.tx.Exec(ctx, sql, RepairTxID)
		if err != nil {
			return fmt.Errorf("renumber events: %w", err)
		}
		if tag.RowsAffected() != r.rep.Events {
			return fmt.Errorf("renumber events: updated %d of %d events", tag.RowsAffected(), r.rep.Events)
		}
	}
	if _, err := r.tx.Exec(ctx, r.q.generatedAlways); err != nil {
		return fmt.Errorf("renumber events: %w", err)
	}
	return nil
}

func (r *repair) remapConsumers(ctx context.Context) error {
	rows, err := r.tx.Query(ctx, r.q.remapConsumers, RepairTxID)
	if err != nil {
		return fmt.Errorf("remap consumer cursors: %w", err)
	}
	var c ConsumerRepair
	var oldFailedTx, newFailedTx *uint64
	var oldFailedSeq, newFailedSeq *int64
	_, err = pgx.ForEachRow(rows, []any{&c.Consumer, &c.Instance, &c.Status,
		&c.OldCursor.TxID, &c.OldCursor.Seq, &c.NewCursor.TxID, &c.NewCursor.Seq,
		&oldFailedTx, &oldFailedSeq, &newFailedTx, &newFailedSeq}, func() error {
		c.OldFailedAt, c.NewFailedAt = position(oldFailedTx, oldFailedSeq), position(newFailedTx, newFailedSeq)
		// New cursors are Start or (RepairTxID, rank): rank events are at
		// or before them.
		c.Behind = r.rep.Events - c.NewCursor.Seq
		r.rep.Consumers = append(r.rep.Consumers, c)
		return nil
	})
	if err != nil {
		return fmt.Errorf("remap consumer cursors: %w", err)
	}
	slices.SortFunc(r.rep.Consumers, func(a, b ConsumerRepair) int {
		return cmp.Or(cmp.Compare(a.Consumer, b.Consumer), cmp.Compare(a.Instance, b.Instance))
	})
	return nil
}

// position reads a nullable stored position; NULL is the zero position.
func position(tx *uint64, seq *int64) projector.Position {
	if tx == nil {
		return projector.Position{}
	}
	p := projector.Position{TxID: *tx}
	if seq != nil {
		p.Seq = *seq
	}
	return p
}

// verify checks the result before it commits: the log holds exactly
// (RepairTxID, 1…n), and at every consumer's new cursor the last event at
// or before it was at or before the old cursor (nothing skipped) and the
// first event after it was after the old cursor (nothing replayed). The
// renumbering keeps the old order, so these two neighbours settle it for
// the whole log.
func (r *repair) verify(ctx context.Context) error {
	var n, lo, hi int64
	var allAtTarget bool
	if err := r.tx.QueryRow(ctx, r.q.verifyLog, RepairTxID).Scan(&n, &lo, &hi, &allAtTarget); err != nil {
		return fmt.Errorf("verify the log: %w", err)
	}
	if n != r.rep.Events || !allAtTarget || (n > 0 && (lo != 1 || hi != n)) {
		return fmt.Errorf("verify the log: %d events at seq %d…%d (all at transaction %d: %v), want %d at 1…%d",
			n, lo, hi, RepairTxID, allAtTarget, r.rep.Events, r.rep.Events)
	}
	for i := range r.rep.Consumers {
		c := &r.rep.Consumers[i]
		var noSkip, noReplay bool
		if err := r.tx.QueryRow(ctx, r.q.verifyCursor, c.NewCursor.TxID, c.NewCursor.Seq, c.OldCursor.TxID, c.OldCursor.Seq).Scan(&noSkip, &noReplay); err != nil {
			return fmt.Errorf("verify cursor of consumer %s@%s: %w", c.Consumer, c.Instance, err)
		}
		if !noSkip || !noReplay {
			return fmt.Errorf("verify cursor of consumer %s@%s: %s → %s would skip (%v) or replay (%v) events; rolled back",
				c.Consumer, c.Instance, c.OldCursor, c.NewCursor, !noSkip, !noReplay)
		}
	}
	return nil
}

// positionColumns are every stored transaction id in the schema, in the
// order of the check's columns. A test compares them with the schema's xid8
// columns, so a migration that adds one cannot be forgotten here.
var positionColumns = []string{
	"projector_events.tx_id",
	"projector_streams.last_tx_id",
	"projector_consumers.cursor_tx_id",
	"projector_consumers.failed_tx_id",
	"projector_dead_letters.event_tx_id",
	"projector_consumers.replay_until_tx_id",
	"projector_rebuilds.target_tx_id",
	"projector_events_archive.tx_id",
	"projector_consumers.hold_tx_id",
}

type repairSQL struct {
	events                                                          string // the quoted, qualified events table
	lock, check                                                     string
	buildMap                                                        []string
	countMap, anyAtTarget                                           string
	generatedByDefault, renumber, renumberNegative, flipNegative    string
	generatedAlways, remapConsumers, remapDeadLetters, resetStreams string
	remapReplays, remapRebuilds, remapArchive, remapHolds           string
	verifyLog, verifyCursor, raiseSequence                          string
}

// repairMapTable lives for the repair's transaction only.
const repairMapTable = `pg_temp.projector_repair_map`

// newSeqAtOrBefore is the rank of the last event at or before the old
// position (%[1]s, %[2]s), NULL when there is none.
const newSeqAtOrBefore = `(SELECT m.new_seq FROM ` + repairMapTable + ` m
	WHERE (m.old_tx_id, m.old_seq) <= (%[1]s, %[2]s) ORDER BY m.old_tx_id DESC, m.old_seq DESC LIMIT 1)`

func atOrBefore(tx, seq string) string { return fmt.Sprintf(newSeqAtOrBefore, tx, seq) }

func newRepairSQL(schema string) repairSQL {
	e, s := schema+".projector_events", schema+".projector_streams"
	c, d := schema+".projector_consumers", schema+".projector_dead_letters"
	a := schema + ".projector_events_archive"
	return repairSQL{
		events: e,
		lock:   `LOCK TABLE ` + c + `, ` + s + `, ` + e + `, ` + d + `, ` + a + ` IN ACCESS EXCLUSIVE MODE`,
		check: `SELECT pg_snapshot_xmin(pg_current_snapshot()), pg_snapshot_xmax(pg_current_snapshot()),
			(SELECT max(tx_id) FROM ` + e + `), (SELECT max(last_tx_id) FROM ` + s + `),
			(SELECT max(cursor_tx_id) FROM ` + c + `), (SELECT max(failed_tx_id) FROM ` + c + `),
			(SELECT max(event_tx_id) FROM ` + d + `), (SELECT max(replay_until_tx_id) FROM ` + c + `),
			(SELECT max(target_tx_id) FROM ` + schema + `.projector_rebuilds),
			(SELECT max(tx_id) FROM ` + a + `), (SELECT max(hold_tx_id) FROM ` + c + `)`,
		buildMap: []string{
			`CREATE TEMP TABLE projector_repair_map ON COMMIT DROP AS
				SELECT id, tx_id AS old_tx_id, seq AS old_seq, row_number() OVER (ORDER BY tx_id, seq) AS new_seq
				FROM ` + e,
			`CREATE UNIQUE INDEX ON ` + repairMapTable + ` (old_tx_id, old_seq) INCLUDE (new_seq)`,
			`CREATE UNIQUE INDEX ON ` + repairMapTable + ` (id) INCLUDE (new_seq)`,
			`ANALYZE ` + repairMapTable,
		},
		countMap:           `SELECT count(*) FROM ` + repairMapTable,
		anyAtTarget:        `SELECT EXISTS (SELECT 1 FROM ` + e + ` WHERE tx_id = $1::xid8)`,
		generatedByDefault: `ALTER TABLE ` + e + ` ALTER COLUMN seq SET GENERATED BY DEFAULT`,
		generatedAlways:    `ALTER TABLE ` + e + ` ALTER COLUMN seq SET GENERATED ALWAYS`,
		renumber: `UPDATE ` + e + ` e SET tx_id = $1::xid8, seq = m.new_seq
			FROM ` + repairMapTable + ` m WHERE e.tx_id = m.old_tx_id AND e.seq = m.old_seq`,
		renumberNegative: `UPDATE ` + e + ` e SET tx_id = $1::xid8, seq = -m.new_seq
			FROM ` + repairMapTable + ` m WHERE e.tx_id = m.old_tx_id AND e.seq = m.old_seq`,
		flipNegative: `UPDATE ` + e + ` SET seq = -seq WHERE tx_id = $1::xid8 AND seq < 0`,
		// The self-join returns each row's old values beside its new ones.
		remapConsumers: `UPDATE ` + c + ` c SET
				cursor_tx_id = CASE WHEN (c.cursor_tx_id, c.cursor_seq) = ('0'::xid8, 0) THEN '0'::xid8 ELSE $1::xid8 END,
				cursor_seq = CASE WHEN (c.cursor_tx_id, c.cursor_seq) = ('0'::xid8, 0) THEN 0
					ELSE coalesce(` + atOrBefore("c.cursor_tx_id", "c.cursor_seq") + `, 0) END,
				failed_tx_id = CASE WHEN c.failed_tx_id IS NULL THEN NULL ELSE $1::xid8 END,
				failed_seq = CASE WHEN c.failed_tx_id IS NULL THEN NULL ELSE coalesce(
					(SELECT m.new_seq FROM ` + repairMapTable + ` m WHERE m.id = c.failed_event_id),
					` + atOrBefore("c.failed_tx_id", "coalesce(c.failed_seq, 0)") + `, 0) END
			FROM ` + c + ` o WHERE o.name = c.name AND o.instance_id = c.instance_id
			RETURNING c.name, c.instance_id, c.status,
				o.cursor_tx_id, o.cursor_seq, c.cursor_tx_id, c.cursor_seq,
				o.failed_tx_id, o.failed_seq, c.failed_tx_id, c.failed_seq`,
		// A rebuild's replay end and target are positions like the
		// cursor: the last event at or before them.
		remapReplays: `UPDATE ` + c + ` c SET
				replay_until_tx_id = $1::xid8,
				replay_until_seq = coalesce(` + atOrBefore("c.replay_until_tx_id", "c.replay_until_seq") + `, 0)
			WHERE c.replay_until_tx_id IS NOT NULL`,
		// A merge's hold is a position like the cursor it was taken from,
		// mapped the same way, so a partition standing at its hold still
		// does after the repair.
		remapHolds: `UPDATE ` + c + ` c SET
				hold_tx_id = CASE WHEN (c.hold_tx_id, c.hold_seq) = ('0'::xid8, 0) THEN '0'::xid8 ELSE $1::xid8 END,
				hold_seq = CASE WHEN (c.hold_tx_id, c.hold_seq) = ('0'::xid8, 0) THEN 0
					ELSE coalesce(` + atOrBefore("c.hold_tx_id", "c.hold_seq") + `, 0) END
			WHERE c.hold_tx_id IS NOT NULL`,
		remapRebuilds: `UPDATE ` + schema + `.projector_rebuilds r SET target_tx_id = $1::xid8,
				target_seq = coalesce(` + atOrBefore("r.target_tx_id", "r.target_seq") + `, 0)
			WHERE r.target_tx_id <> '0'::xid8`,
		remapDeadLetters: `UPDATE ` + d + ` d SET event_tx_id = $1::xid8, event_seq = coalesce(
				(SELECT m.new_seq FROM ` + repairMapTable + ` m WHERE m.id = d.event_id),
				` + atOrBefore("d.event_tx_id", "d.event_seq") + `, 0)`,
		resetStreams: `UPDATE ` + s + ` SET last_tx_id = $1::xid8 WHERE last_tx_id <> $1::xid8`,
		// Archived events keep their order among themselves and sort
		// before every renumbered event (they are older than any event
		// still hot in their stream): seq -rank, ranked newest first so the
		// oldest gets the lowest seq. The archive's key is the
		// stream version, so the update cannot collide with itself.
		remapArchive: `UPDATE ` + a + ` a SET tx_id = $1::xid8, seq = -m.rank
			FROM (SELECT tenant_id, stream_type, stream_id, version, row_number() OVER (ORDER BY tx_id DESC, seq DESC) AS rank FROM ` + a + `) m
			WHERE (a.tenant_id, a.stream_type, a.stream_id, a.version) = (m.tenant_id, m.stream_type, m.stream_id, m.version)`,
		verifyLog: `SELECT count(*), coalesce(min(seq), 0), coalesce(max(seq), 0), coalesce(bool_and(tx_id = $1::xid8), true)
			FROM ` + e,
		verifyCursor: `SELECT
			coalesce((SELECT (m.old_tx_id, m.old_seq) <= ($3::xid8, $4::bigint)
				FROM ` + e + ` e JOIN ` + repairMapTable + ` m ON m.id = e.id
				WHERE (e.tx_id, e.seq) <= ($1::xid8, $2::bigint) ORDER BY e.tx_id DESC, e.seq DESC LIMIT 1), true),
			coalesce((SELECT (m.old_tx_id, m.old_seq) > ($3::xid8, $4::bigint)
				FROM ` + e + ` e JOIN ` + repairMapTable + ` m ON m.id = e.id
				WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) ORDER BY e.tx_id, e.seq LIMIT 1), true)`,
		raiseSequence: `SELECT setval(q.seq, GREATEST($1::bigint, coalesce(pg_sequence_last_value(q.seq), 1)))
			FROM (SELECT pg_get_serial_sequence($2, 'seq')::regclass AS seq) q`,
	}
}

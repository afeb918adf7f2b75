package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/clientcheck"
	"github.com/projectorhq/projector/stores/postgres"
)

type passKind int

const (
	passCaughtUp passKind = iota // nothing more to read below the horizon
	passMore                     // a full batch: read again at once
	passRetryAt                  // an event is failing; wait until retryAt
	passLocked                   // another process holds the shard
	passDead
	passDisabled
	passSuperseded // the consumer's model is of another version than this projection
	passGone       // a shadow shard whose rebuild ended: its loop stops
	passNotMine    // a partition another process works (balance.go)
	passAtHold     // a held half at its hold, not merged: until a shard wake or Recheck (mergehandoff.go)
)

type passResult struct {
	kind    passKind
	retryAt time.Time
	// held: the pass took the shard's lock (a process that tried it
	// meanwhile found it taken; see runShard).
	held bool
	// quiet: the wait until retryAt is not cut short by a shard wake
	// (holdRetry).
	quiet bool
}

type dispatchSQL struct {
	register, unregister, tryLock, state, waitLock, advance, advanceShadow, fail, deadLetter, probe, cursor, cursors string
}

func buildDispatchSQL(store *postgres.Store) dispatchSQL {
	c, e := store.Table("projector_consumers"), store.Table("projector_events")
	return dispatchSQL{
		register: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, version) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (name, instance_id) DO NOTHING`,
		unregister: `DELETE FROM ` + c + ` WHERE name = $1 AND instance_id = $2`,
		// The shard is locked with a transaction-scoped advisory lock rather
		// than a row lock: a row lock would give the pass a transaction id at
		// once, and every running transaction with an id holds back the
		// horizon of every reader in the cluster. With the advisory lock a
		// pass takes an id only when a handler first writes, or at the
		// cursor update, so a slow read-only handler (a call to another
		// service) does not stall every other consumer.
		tryLock: `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))`,
		// Read in a statement of its own, after the lock: in one statement
		// the snapshot would predate the lock, and a pass that committed in
		// between would be read as not yet done.
		//
		// The last column says whether the archive holds events after the
		// cursor (`streams archive`): a shard registered after streams
		// were archived, rewound by a rebuild or enabled again below them
		// then reads the archive too (LogQuery.IncludeArchived). One
		// backward descent of the archive's position index to its last
		// event (written so: a plain EXISTS of a position after the
		// cursor was planned as a scan of the whole archive, 240 ms on
		// 180,000 archived events against 0.1 ms); false for a shard
		// caught up, whose reads stay the hot log's alone. The answer
		// holds for the whole pass: an archive batch moves only events
		// every shard that is not disabled has passed, and this one's
		// cursor and status cannot change while the pass holds its lock.
		state: `SELECT c.cursor_tx_id, c.cursor_seq, c.status, c.attempts,
				coalesce(c.failed_event_id, '00000000-0000-0000-0000-000000000000'),
				coalesce(c.next_retry_at > now(), false), coalesce(c.next_retry_at, 'epoch'),
				c.version, coalesce(c.replay_until_tx_id, '0'), coalesce(c.replay_until_seq, 0), coalesce(c.shadow_schema, ''),
				coalesce(c.owner, ''), c.hold_tx_id IS NOT NULL, coalesce(c.hold_tx_id, '0'), coalesce(c.hold_seq, 0),
				c.split_requested_at IS NOT NULL,
				-- A marked partition's try of its consumer's fence (splithandoff.go):
				-- only when marked, and only for a pass that may split ($3).
				CASE WHEN c.split_requested_at IS NOT NULL AND $3::bool THEN pg_try_advisory_xact_lock_shared(hashtextextended($4::text, 0)) ELSE false END,
				EXISTS (SELECT 1 FROM (SELECT a.tx_id, a.seq FROM ` + store.Table("projector_events_archive") + ` a ORDER BY a.tx_id DESC, a.seq DESC LIMIT 1) m
					WHERE (m.tx_id, m.seq) > (c.cursor_tx_id, c.cursor_seq))
			FROM ` + c + ` c WHERE c.name = $1 AND c.instance_id = $2`,
		waitLock: waitShardLockSQL,
		cursor:   `SELECT cursor_tx_id, cursor_seq, status FROM ` + c + ` WHERE name = $1 AND instance_id = $2`,
		cursors: `SELECT c.name, c.instance_id, c.cursor_tx_id, c.cursor_seq, c.status FROM ` + c + ` c
			JOIN unnest($1::text[], $2::text[]) AS s(name, instance_id) USING (name, instance_id)`,
		// A replay ends once the cursor reaches the position it started
		// at: the row comparison is NULL, and the CASE keeps NULL, without one.
		advance: `UPDATE ` + c + ` SET cursor_tx_id = $3, cursor_seq = $4, status = $5, attempts = 0,
				last_error = NULL, last_error_at = NULL, failed_tx_id = NULL, failed_seq = NULL,
				failed_event_id = NULL, next_retry_at = NULL, processed = processed + $6, updated_at = now(),
				replay_until_tx_id = CASE WHEN ($3::xid8, $4::bigint) >= (replay_until_tx_id, replay_until_seq) THEN NULL ELSE replay_until_tx_id END,
				replay_until_seq = CASE WHEN ($3::xid8, $4::bigint) >= (replay_until_tx_id, replay_until_seq) THEN NULL ELSE replay_until_seq END
			WHERE name = $1 AND instance_id = $2`,
		advanceShadow: advanceShadowSQL(c),
		// The backoff runs from the failure (clock_timestamp), not from the
		// pass's start (now()): a pass that spent the backoff on a long batch
		// or a slow handler before the failure would otherwise leave the
		// next attempt due at its commit, for any wake-up to take.
		fail: `UPDATE ` + c + ` SET cursor_tx_id = $3, cursor_seq = $4, status = $5, attempts = $6,
				last_error = $7, last_error_at = now(), failed_tx_id = $8, failed_seq = $9, failed_event_id = $10,
				next_retry_at = CASE WHEN $5 = 'dead' THEN NULL ELSE clock_timestamp() + make_interval(secs => $11) END,
				processed = processed + $12, updated_at = now()
			WHERE name = $1 AND instance_id = $2`,
		deadLetter: `INSERT INTO ` + store.Table("projector_dead_letters") + `
			(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, 'apply-error')`,
		// The newest event, hot or archived (archived streams may be the
		// log's newest): one descent of each table's position index.
		probe: `SELECT e.tx_id, e.seq, pg_snapshot_xmin(pg_current_snapshot())
			FROM (SELECT 1) one LEFT JOIN LATERAL (
				SELECT tx_id, seq FROM ((SELECT tx_id, seq FROM ` + e + ` ORDER BY tx_id DESC, seq DESC LIMIT 1)
					UNION ALL (SELECT tx_id, seq FROM ` + store.Table("projector_events_archive") + ` ORDER BY tx_id DESC, seq DESC LIMIT 1)) u
				ORDER BY tx_id DESC, seq DESC LIMIT 1
			) e ON true`,
	}
}

// pass runs one transaction for sh: lock its state row, read a batch, apply
// it, advance the cursor, commit. A handler failure is not an error of the
// pass (it is recorded on the shard); an error means the database failed
// and the transaction rolled back.
func (d *Dispatcher) pass(ctx context.Context, sh *shard) (res passResult, err error) {
	if sh.removed.Load() {
		return passResult{kind: passGone}, nil // a partition split or merged away (balance.go)
	}
	dropHalves(sh) // read for a split an earlier pass did not make
	// The balancer's decisions about the partition as of now (standAside).
	var decided uint64
	if sh.balancer != nil {
		var mine bool
		if mine, decided = sh.balancer.ownership(sh.id.Instance); !mine {
			return passResult{kind: passNotMine}, nil
		}
	}
	// The connection is held apart from the transaction so that the cursor
	// advance and the COMMIT can go out in one round trip (advanceCommit),
	// after which pgx's transaction is not ended but the server's is: the
	// pool takes back a connection only when it is idle in no transaction.
	conn, err := d.store.Pool().Acquire(ctx)
	if err != nil {
		return passResult{}, fmt.Errorf("begin: %w", err)
	}
	var plan []postgres.LogQuery // reads to plan on conn once the pass is done (readplan.go)
	defer func() {
		if len(plan) == 0 || err != nil || res.kind == passGone {
			conn.Release()
			return
		}
		d.wg.Go(func() { d.planReads(ctx, conn, plan) })
	}()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return passResult{}, fmt.Errorf("begin: %w", err)
	}
	committed := false // by advanceCommit
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	// The lock and the state read go out pipelined, one round trip, as two
	// statements: the read's snapshot is taken after the lock is held.
	var st shardRow
	var locked bool
	b := &pgx.Batch{}
	if sh.gateKey != "" {
		// A partition: behind its consumer's layout gate (layoutgate.go).
		b.Queue(tryLockGatedSQL, sh.lockKey, sh.gateKey).QueryRow(func(row pgx.Row) error { return row.Scan(&locked) })
	} else {
		b.Queue(d.sql.tryLock, sh.lockKey).QueryRow(func(row pgx.Row) error { return row.Scan(&locked) })
	}
	exists := true
	var sc splitCheck
	b.Queue(d.sql.state, sh.id.Consumer, sh.id.Instance, sh.mayHandOff(), d.fenceKey(sh)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&st.cursor.TxID, &st.cursor.Seq, &st.status, &st.attempts, &st.failedEvent, &st.waiting, &st.retryAt,
			&st.version, &st.replayUntil.TxID, &st.replayUntil.Seq, &st.shadowSchema, &st.owner, &st.held, &st.hold.TxID, &st.hold.Seq, &st.splitMark, &sc.fenced, &st.archived)
		if errors.Is(err, pgx.ErrNoRows) {
			exists = false
			return nil
		}
		return err
	})
	d.queueSplitCheck(b, sh, &sc) // a marked partition's look at its mark under the fence (splithandoff.go)
	// The first handler savepoint goes out in the same round trip: taking
	// it before the log read changes nothing (the read writes nothing), it
	// takes no transaction id, and a pass that stops here rolls it back
	// with the rest. A shadow pass writes its own state before the
	// handlers run (search path, rebuild status), which a rollback to this
	// savepoint would undo: it takes a savepoint of its own later.
	if sh.shadow != nil {
		// A shadow batch is long and holds the horizon while it runs: it
		// names itself in pg_stat_activity, whatever the pool's
		// application_name, so the horizon line tells Projector's own work
		// from a forgotten session. Local to the transaction.
		b.Queue(`SELECT set_config('application_name', $1, true)`, shadowApplicationName(sh.id.Consumer))
	}
	if clientcheck.Supported(conn.Conn().PgConn()) {
		// A backend of this pass outlives a killed dispatcher no longer
		// than a second, even waiting for a lock: it would keep the shard.
		b.Queue(clientcheck.SQL)
	}
	b.Queue("SAVEPOINT " + savepointName(0))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return passResult{}, fmt.Errorf("lock shard: %w", err)
	}
	if locked {
		defer func() { res.held = true }()
	}
	switch {
	case !locked:
		return passResult{kind: passLocked}, nil // another process has it, or a split or merge (layoutgate.go)
	case !exists && sh.shadow != nil:
		return passResult{kind: passGone}, nil // the rebuild switched or was cancelled
	case !exists && sh.balancer != nil:
		// Split or merged away under this partition's lock (split.go): its
		// children or parent carry on. Never registered again, which would
		// apply its streams' events a second time.
		sh.removed.Store(true)
		return passResult{kind: passGone}, nil
	case !exists:
		return d.registerAgain(ctx, tx, sh)
	case sh.shadow != nil && st.shadowSchema != sh.shadow.schema:
		return passResult{kind: passGone}, nil // another rebuild's shadow
	case sh.shadow == nil && st.version != sh.proj.cfg.Version:
		return d.superseded(ctx, sh, st.version), nil
	case sh.balancer != nil && st.owner != d.instance:
		// Another process took the partition since this one's last
		// balancing round, or this one's released it: stand aside at
		// once (the lock kept this pass from overlapping with its
		// passes). Unless this process's round decided about it since
		// the pass began (it may have claimed it after the state read):
		// then look again.
		if !sh.balancer.standAside(sh.id.Instance, decided) {
			return passResult{kind: passMore}, nil
		}
		return passResult{kind: passNotMine}, nil
	}
	if sh.shadow == nil && sh.proj.cfg.External != nil {
		// A rebuild's switch committed and its swap has not happened: the
		// live target is still the old one, so stand aside until the swap
		// is done, doing it here under the live lock.
		found, err := d.swapping(ctx, tx, sh)
		if errors.Is(err, errSwapElsewhere) {
			return passResult{kind: passLocked}, nil
		}
		if err != nil {
			return passResult{}, err
		}
		if found {
			if err := tx.Commit(ctx); err != nil {
				return passResult{}, fmt.Errorf("commit the swap: %w", err)
			}
			return passResult{kind: passMore}, nil
		}
	}
	switch {
	case st.status == StatusDead:
		return passResult{kind: passDead}, nil
	case st.status == StatusDisabled:
		return passResult{kind: passDisabled}, nil
	case st.waiting:
		return passResult{kind: passRetryAt, retryAt: st.retryAt}, nil
	}

	cfg := sh.proj.cfg
	switching := false
	if sh.shadow != nil {
		if switching, err = d.shadowPass(ctx, tx, sh); err != nil {
			return passResult{}, err
		}
	}
	size := cfg.BatchSize
	if sh.shadow != nil {
		size = cfg.RebuildBatchSize // no reader waits for a shadow batch: read more at once
		if !sh.ramped {
			// The first batches are small and double pass by pass (grow),
			// so a rebuild's progress moves on a log smaller than one full
			// batch, and an operator watching a large one sees it start at
			// once.
			sh.ramped = true
			if size > firstShadowBatch {
				sh.limit, sh.ramping = firstShadowBatch, true
			}
		}
	}
	q := postgres.LogQuery{After: st.cursor, Limit: sh.batchLimit(size), EventTypes: sh.proj.t.types, Raw: true, Partition: sh.readSegment(),
		IncludeArchived: st.archived}
	plan = d.neighbourReads(conn, sh, q)
	var batch postgres.LogBatch
	if !st.held || st.cursor != st.hold || sh.shadow != nil {
		// (A half standing at its hold reads nothing: it only tries the merge.)
		if batch, err = d.readBatch(ctx, tx, sh, q); err != nil {
			return passResult{}, err
		}
	}

	replaying := sh.shadow != nil
	if st.replayUntil != projector.Start && st.cursor.Less(st.replayUntil) {
		// Replaying in place: a batch stops at the position the rebuild
		// started at, so every event of it is a replay or none is.
		n := len(batch.Events)
		for n > 0 && st.replayUntil.Less(batch.Events[n-1].Position) {
			n--
		}
		if n > 0 {
			replaying = true
			if n < len(batch.Events) {
				batch.Events, batch.Full = batch.Events[:n], true
			}
		}
	}
	next := batch.Next(st.cursor)
	if st.held {
		next = holdBatch(&batch, next, st.hold)
	}
	if sh.shadow != nil {
		// Never replay past what the live model handled live
		// (rebuild_live.go).
		leaving := false // a switching shadow pass that leaves events to their partitions
		if next, leaving, err = d.capShadow(ctx, tx, sh, switching, &batch, st.cursor, next); err != nil {
			return passResult{}, err
		}
		if leaving {
			// It reads on to every partition's frontier, batch after
			// batch, and switches (rebuild_gap.go).
			return d.switchThroughGap(ctx, tx, sh, st, q, batch, next)
		}
	}
	if batch.Full {
		if splitAtEnd(sh, st, sc) {
			d.prefetchHalves(ctx, sh, q, next) // the batch after this one is theirs (splithandoff.go)
		} else {
			d.startPrefetch(ctx, sh, q, next)
		}
	}
	if sh.keyed() {
		batch.Events = d.ownEvents(sh, batch.Events) // the cursor still passes the others' (partitionkey.go)
	}
	parked := 0 // events of parked streams held back (park.go)
	if sh.parking() {
		if batch.Events, parked, err = d.parkHeld(ctx, tx, sh, batch.Events); err != nil {
			return passResult{}, err
		}
	}
	status := StatusIdle
	if batch.Full {
		status = StatusProcessing
	}
	if len(batch.Events) == 0 {
		if switching {
			switched, err := d.switchShadow(ctx, tx, sh, st.cursor, next)
			if err != nil {
				return passResult{}, err
			}
			if switched {
				res, err := d.commit(ctx, tx, sh, passGone, nil, 0, 0, time.Time{})
				if err == nil && sh.proj.cfg.External != nil {
					d.finishSwap(ctx, sh)
				}
				return res, err
			}
		}
		caughtUp := passCaughtUp
		if sh.shadow != nil {
			if !sh.shadow.final {
				caughtUp = passMore // try the switch at once, not after Recheck
			}
			sh.shadow.final = true
		}
		unchanged := next == st.cursor && st.status == StatusIdle && st.attempts == 0
		if sh.shadow != nil && (unchanged || next == st.cursor && st.attempts > 0) {
			// The rebuild may have moved to ready.
			res, err := d.commit(ctx, tx, sh, caughtUp, nil, 0, 0, time.Time{})
			return sh.shadowResult(res), err
		}
		split := splitAtEnd(sh, st, sc)
		merge, err := d.mergeAtHold(ctx, tx, sh, st, next, status, 0) // held at the hold (mergehandoff.go)
		if err != nil {
			return passResult{}, err
		}
		if unchanged && !split && merge == nil {
			// Nothing to write, also for a partition marked to split
			// (or held) that cannot split (or merge) now: its next pass
			// tries again.
			return holdRetry(sh, passResult{kind: atHold(sh, st, next, passCaughtUp)}), nil
		}
		if err := d.advanceCommit(ctx, tx, sh, next, status, 0, d.atEnd(sh, split, merge)); err != nil {
			return passResult{}, err
		}
		committed = true
		res := holdRetry(sh, sh.shadowResult(d.committed(sh, atHold(sh, st, next, caughtUp), nil, 0, 0, time.Time{})))
		if split || merge != nil {
			d.changedAtEnd(ctx, sh, split, merge)
			return passResult{kind: passGone}, nil
		}
		return res, nil
	}

	started := time.Now()
	ap := batchApply{parked: parked}
	if res, ended, err := d.applyEvents(ctx, tx, sh, st, batch.Events, replaying, &ap, started); ended || err != nil {
		return res, err
	}
	done, deadLetters := ap.done, ap.deadLetters
	if forgotten, err := d.openedSubjectsForgotten(ctx, tx, sh, done); err != nil || forgotten {
		return passResult{kind: passMore}, err // a forget committed meanwhile: read again (forgetguard.go)
	}
	switched := false
	if switching && !batch.Full {
		if switched, err = d.switchShadow(ctx, tx, sh, st.cursor, next); err != nil {
			return passResult{}, err
		}
	}
	kind := passCaughtUp
	switch {
	case switched:
		kind = passGone
	case batch.Full:
		kind = passMore
	}
	split := !switched && splitAtEnd(sh, st, sc)
	var merge *mergeAtEnd
	if !switched {
		if merge, err = d.mergeAtHold(ctx, tx, sh, st, next, status, len(done)); err != nil {
			return passResult{}, err
		}
	}
	if switched {
		res, err = d.commit(ctx, tx, sh, kind, done, 0, deadLetters, started)
	} else if err = d.advanceCommit(ctx, tx, sh, next, status, len(done), d.atEnd(sh, split, merge)); err == nil {
		committed = true
		res = holdRetry(sh, d.committed(sh, atHold(sh, st, next, kind), done, 0, deadLetters, started))
		if split || merge != nil {
			d.changedAtEnd(ctx, sh, split, merge)
			return passResult{kind: passGone}, nil
		}
	}
	if err == nil {
		sh.grow(size)
		if sh.shadow != nil {
			// Caught up: the next pass tries the switch, at once the first
			// time (a quiet log would wake it only after Recheck).
			if kind == passCaughtUp && !sh.shadow.final {
				res.kind = passMore
			}
			sh.shadow.final = kind == passCaughtUp
			res = sh.shadowResult(res)
		}
		if switched {
			d.logger.InfoContext(ctx, "projection dispatcher: rebuild switched; the new version is live",
				slog.String("consumer", sh.id.Consumer), slog.Int("version", sh.proj.cfg.Version), slog.String("cursor", next.String()))
			if sh.proj.cfg.External != nil {
				d.finishSwap(ctx, sh)
			}
		}
	}
	return res, err
}

// batchTimedOut handles a batch whose deadline struck while the handlers
// of failing (an event of events) were running. Nothing of the batch can
// commit: its handlers' context is gone, and when the deadline cancelled a
// statement the connection went with it. Re-applying the events before
// failing under the expired context would fail them too and blame (or, in
// continuous mode, dead-letter) events whose handlers had succeeded, so:
//
//   - when events ran before failing, the next pass, at once, reads only
//     those (they finished within the deadline once, so they commit), and
//     failing then runs at the head of the pass after, under a deadline of
//     its own;
//   - when failing is the first event, it alone outlasted the deadline: that
//     is a failure of failing, recorded from a fresh transaction, retried
//     with backoff and dead after MaxAttempts like any other. A timeout is
//     never dead-lettered, even in continuous mode: a slow dependency is
//     not a poison event.
//
// Either way the shard's cursor stays right before the first event not
// applied, which is what lets Skip move past exactly the failing event.
//
// A switching shadow pass reading a gap (gap: rebuild_gap.go) keeps the
// shadow's cursor where the pass found it instead, since the events before
// failing may include some it left to their partitions.
func (d *Dispatcher) batchTimedOut(ctx context.Context, tx pgx.Tx, sh *shard, st shardRow, events []projector.Event,
	failing projector.Event, herr error, started time.Time, gap bool,
) (passResult, error) {
	// When the deadline cut off a running statement, pgx closed the
	// connection and sent PostgreSQL a cancel request for its backend, so
	// the backend does not keep the shard's lock and the horizon.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	timeout := sh.proj.cfg.BatchTimeout
	// Logged below, or recorded: without the failing event's personal
	// values (errortext.go), as every other recorded failure.
	herr = fmt.Errorf("batch timeout (%v) exceeded: %w", timeout, RedactError(herr, OpenedEvents(d.store.Registry(), failing)...))
	if d.metrics != nil {
		d.metrics.batch(sh.id, 0, 1, 0, time.Time{})
	}
	cut := slices.IndexFunc(events, func(ev projector.Event) bool { return ev.Position == failing.Position })
	if sh.proj.t.batch != nil || cut < 0 {
		// A batch handler got many events at once: which one was slow is
		// unknown, so halve the batch until one event alone times out.
		cut = len(events) / 2
	}
	if cut > 0 {
		sh.limit, sh.ramping = cut, false
		d.logger.WarnContext(ctx, "projection dispatcher: batch timed out; retrying at once with the events that finished before the deadline",
			slog.String("consumer", sh.id.String()), slog.Int("events", cut), slog.Duration("batch_timeout", timeout),
			slog.String("running", failing.ID.String()), slog.Any("error", herr))
		return passResult{kind: passMore}, nil
	}
	at := events[0].Position.Before()
	if gap {
		at = st.cursor
	}
	return d.recordFailureApart(ctx, sh, st, at, events[0], herr, started)
}

// readBatch reads the pass's batch in tx, or takes it from the shard's
// prefetch of it (see prefetch) or from another shard's read of the same
// full batch (see sharedReads).
func (d *Dispatcher) readBatch(ctx context.Context, tx pgx.Tx, sh *shard, q postgres.LogQuery) (postgres.LogBatch, error) {
	batch, ok, shared, err := d.takePrefetch(ctx, sh, q)
	if ok {
		sh.prefetched++
	}
	if !ok && err == nil {
		read := func() (postgres.LogBatch, error) { return d.store.ReadLogTx(ctx, tx, q) }
		if d.shared == nil {
			return read()
		}
		batch, shared, err = d.shared.read(ctx, q, sh.readKey(), read)
	}
	if shared && d.metrics != nil {
		d.metrics.sharedReads.WithLabelValues(sh.id.Consumer, sh.id.Instance).Inc()
	}
	return batch, err
}

// commit ends the pass's transaction and reports what it applied.
func (d *Dispatcher) commit(ctx context.Context, tx pgx.Tx, sh *shard, kind passKind, applied []projector.Event, failed, deadLetters int, started time.Time) (passResult, error) {
	if err := tx.Commit(ctx); err != nil {
		return passResult{}, fmt.Errorf("commit: %w", err)
	}
	return d.committed(sh, kind, applied, failed, deadLetters, started), nil
}

// advanceCommit moves the shard's cursor to next and commits, the UPDATE
// and the COMMIT pipelined in one round trip: the advance is the pass's
// last statement, so nothing needs its answer before the COMMIT is sent.
// A failed UPDATE leaves the COMMIT unexecuted (the server skips to the
// pipeline's end) and the transaction aborted, for the caller's rollback.
// After it returns nil the transaction is committed on the server and must
// not be rolled back or committed again through tx.
//
// also, when set, queues statements between the advance and the COMMIT.
func (d *Dispatcher) advanceCommit(ctx context.Context, tx pgx.Tx, sh *shard, next projector.Position, status Status, processed int, also func(*pgx.Batch)) error {
	advance := d.sql.advance
	if sh.shadow != nil {
		advance = d.sql.advanceShadow // a refused switch's failure stands (rebuild_gap.go)
	}
	b := &pgx.Batch{}
	b.Queue(advance, sh.id.Consumer, sh.id.Instance, next.TxID, next.Seq, status, processed)
	if also != nil {
		also(b)
	}
	b.Queue("COMMIT")
	if also != nil {
		// Statements new to the connection (a split's): one round trip,
		// with no Describe of them after the batch's writes took an id
		// (execbatch.go).
		tag, err := execPipeline(ctx, tx, b)
		if err == nil && tag.String() != "COMMIT" {
			err = pgx.ErrTxCommitRollback
		}
		if err != nil {
			return fmt.Errorf("advance cursor and commit: %w", err)
		}
		return nil
	}
	// A COMMIT that a deferred constraint or the like turned into a
	// rollback fails too: nothing of the pass is in place (commitBatch).
	if err := commitBatch(ctx, tx, b); err != nil {
		return fmt.Errorf("advance cursor and commit: %w", err)
	}
	return nil
}

// splitSelf returns what advanceCommit queues for a pass that splits sh
// (queueSplitSelf), nil for one that does not.
func (d *Dispatcher) splitSelf(sh *shard, split bool) func(*pgx.Batch) {
	if !split {
		return nil
	}
	return func(b *pgx.Batch) { d.queueSplitSelf(b, sh) }
}

// committed reports a pass whose transaction committed: metrics and the
// projection's AfterCommit.
func (d *Dispatcher) committed(sh *shard, kind passKind, applied []projector.Event, failed, deadLetters int, started time.Time) passResult {
	if d.metrics != nil {
		d.metrics.batch(sh.id, len(applied), failed, deadLetters, started)
		d.metrics.applied(sh.id, applied, time.Now())
	}
	if fn := sh.proj.cfg.AfterCommit; fn != nil && len(applied) > 0 {
		fn(applied)
	}
	return passResult{kind: kind}
}

// shardRow is what a pass reads of its shard's state.
type shardRow struct {
	cursor      projector.Position
	status      Status
	attempts    int
	failedEvent uuid.UUID
	waiting     bool
	retryAt     time.Time
	// version is the version of the model the shard maintains.
	version int
	// replayUntil is where an in-place rebuild started: events up to it
	// are replays. Start when not replaying.
	replayUntil projector.Position
	// shadowSchema is the schema a shadow shard builds into.
	shadowSchema string
	// owner is the process that works a partition (balance.go).
	owner string
	// held says a partition waits at hold for its sibling before they
	// merge (split.go): its cursor never passes it.
	held bool
	hold projector.Position
	// splitMark says `consumer split` asked this partition's pass to
	// split it at its end (splithandoff.go).
	splitMark bool
	// archived says the archive holds events after the cursor: the pass
	// reads it too.
	archived bool
}

// holdBatch cuts a held partition's batch at its hold and returns where its
// cursor may move: not past the hold. Events after the hold are left for the
// merged partition. An event after the hold in the batch means every event
// up to the hold was read (log order), so the cursor may stand at the hold
// exactly.
func holdBatch(batch *postgres.LogBatch, next, hold projector.Position) projector.Position {
	k := len(batch.Events)
	for k > 0 && hold.Less(batch.Events[k-1].Position) {
		k--
	}
	if k < len(batch.Events) {
		batch.Events, batch.Full = batch.Events[:k], false
		return hold
	}
	if hold.Less(next) {
		return hold
	}
	return next
}

// registerAgain restores a shard row an operator deleted, from the
// beginning of the log.
func (d *Dispatcher) registerAgain(ctx context.Context, tx pgx.Tx, sh *shard) (passResult, error) {
	if _, err := tx.Exec(ctx, d.sql.register, sh.id.Consumer, sh.id.Instance, uint64(0), int64(0), sh.proj.cfg.Version); err != nil {
		return passResult{}, fmt.Errorf("register shard again: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return passResult{}, fmt.Errorf("register shard again: %w", err)
	}
	d.logger.WarnContext(ctx, "projection dispatcher: shard row was missing; registered again from the beginning", slog.String("consumer", sh.id.String()))
	return passResult{kind: passMore}, nil
}

// failedAttempts is how many times failing has failed, this time included:
// the shard counts the attempts of the event it last failed on.
func failedAttempts(st shardRow, failing projector.Event) int {
	if failing.ID == st.failedEvent {
		return st.attempts + 1
	}
	return 1
}

// recordFailure commits the events before the failing one and records the
// failure: attempts (counted per failing event), error, position and the
// next retry time, or dead after MaxAttempts.
//
// The cursor moves to just before the failing event. Every event of the
// consumer's types before it was applied in tx (or earlier), and any event
// between the last of them and the failing one is of another type: the
// pass read them all below one horizon. So the failing event is the next
// event after the cursor, the invariant Admin.Skip checks before it moves
// the cursor past it.
func (d *Dispatcher) recordFailure(ctx context.Context, tx pgx.Tx, sh *shard, attempts int, prevFailed uuid.UUID,
	failing projector.Event, herr error, applied []projector.Event, started time.Time,
) (passResult, error) {
	return d.recordFailureAt(ctx, tx, sh, attempts, prevFailed, failing.Position.Before(), failing, herr, applied, started)
}

// recordFailureAt is recordFailure with the cursor at cursor.
func (d *Dispatcher) recordFailureAt(ctx context.Context, tx pgx.Tx, sh *shard, attempts int, prevFailed uuid.UUID, cursor projector.Position,
	failing projector.Event, herr error, applied []projector.Event, started time.Time,
) (passResult, error) {
	if failing.ID == prevFailed {
		attempts++
	} else {
		attempts = 1
	}
	// What is recorded and logged holds no personal value of failing
	// (errortext.go).
	herr = RedactError(herr, OpenedEvents(d.store.Registry(), failing)...)
	cfg := sh.proj.cfg
	status := StatusProcessing
	systemic := IsSystemic(herr)
	if systemic && !errors.Is(herr, ErrSystemic) {
		herr = fmt.Errorf("%w: %w", ErrSystemic, herr)
	}
	if attempts >= cfg.MaxAttempts || systemic {
		status = StatusDead
	}
	if forgotten, err := d.openedSubjectsForgotten(ctx, tx, sh, applied); err != nil || forgotten {
		return passResult{kind: passMore}, err // a forget committed meanwhile: read again (forgetguard.go)
	}
	wait := sh.proj.backoff(attempts, rand.Float64())
	if _, err := tx.Exec(ctx, d.sql.fail, sh.id.Consumer, sh.id.Instance, cursor.TxID, cursor.Seq, status, attempts,
		StoredError(herr), failing.Position.TxID, failing.Position.Seq, [16]byte(failing.ID), wait.Seconds(), len(applied)); err != nil {
		return passResult{}, fmt.Errorf("record failure: %w", err)
	}
	res, err := d.commit(ctx, tx, sh, passRetryAt, applied, 1, 0, started)
	if err != nil {
		return res, err
	}
	log := d.logger.With(slog.String("consumer", sh.id.Consumer), slog.String("instance_id", sh.id.Instance),
		slog.String("event_id", failing.ID.String()), slog.String("type", failing.Type),
		slog.String("position", failing.Position.String()), slog.Int("attempt", attempts), slog.Any("error", herr))
	if systemic {
		log.ErrorContext(ctx, "projection dispatcher: systemic failure (not about one event): shard stopped (dead), nothing dead-lettered; fix the cause, then restart the consumer",
			slog.String("sqlstate", sqlState(herr)))
		return passResult{kind: passDead}, nil
	}
	if status == StatusDead {
		log.ErrorContext(ctx, "projection dispatcher: shard is dead after MaxAttempts; it stays stopped until an operator restarts, skips or disables it",
			slog.Int("max_attempts", cfg.MaxAttempts))
		return passResult{kind: passDead}, nil
	}
	log.WarnContext(ctx, "projection dispatcher: handler failed; will retry", slog.Duration("retry_in", wait))
	res.retryAt = time.Now().Add(wait)
	return res, nil
}

// recordFailureApart records a failure of failing, with the shard's cursor
// at cursor, in a transaction of its own: the pass's transaction cannot be
// used after its deadline (the first event of a batch alone outlasted it),
// or was rolled back (a switching shadow pass that failed in a gap:
// switchFailed).
func (d *Dispatcher) recordFailureApart(ctx context.Context, sh *shard, st shardRow, cursor projector.Position, failing projector.Event,
	herr error, started time.Time,
) (passResult, error) {
	tx, err := d.store.Pool().Begin(ctx)
	if err != nil {
		return passResult{}, fmt.Errorf("record failure: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		return passResult{}, fmt.Errorf("record failure: %w", err)
	}
	if _, err := tx.Exec(ctx, d.sql.waitLock, sh.lockKey); err != nil {
		return passResult{}, fmt.Errorf("record failure: %w", err)
	}
	var cur projector.Position
	if err := tx.QueryRow(ctx, d.sql.cursor, sh.id.Consumer, sh.id.Instance).Scan(&cur.TxID, &cur.Seq, new(Status)); err != nil {
		return passResult{}, fmt.Errorf("record failure: %w", err)
	}
	if cur != st.cursor {
		return passResult{kind: passMore}, nil // someone moved the shard meanwhile; start over
	}
	return d.recordFailureAt(ctx, tx, sh, st.attempts, st.failedEvent, cursor, failing, herr, nil, started)
}

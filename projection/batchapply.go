package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// batchApply is what the handlers of a pass's events did, summed over the
// batches of a switching shadow pass that reads a gap (rebuild_gap.go).
type batchApply struct {
	// done are the events applied, for AfterCommit.
	done        []projector.Event
	deadLetters int
	// parked counts the events held back or parked (park.go).
	parked int
	// gap is set for a switching shadow pass that left events to their
	// partitions: its cursor has passed events it did not apply, so it
	// either switches or rolls back, and a failure is recorded with the
	// shadow's cursor where the pass found it (switchFailed).
	gap bool
}

// applyEvents runs the handlers of events, read after st.cursor, in tx,
// under a deadline of their own (cfg.BatchTimeout), and adds what they did
// to ap. It reports ended when the pass ends here (a timeout, a recorded
// failure), with the pass's result.
func (d *Dispatcher) applyEvents(ctx context.Context, tx pgx.Tx, sh *shard, st shardRow, events []projector.Event, replaying bool,
	ap *batchApply, started time.Time,
) (res passResult, ended bool, err error) {
	if len(events) == 0 {
		return passResult{}, false, nil
	}
	cfg := sh.proj.cfg
	// Handlers get a deadline: a pass with a transaction id holds back
	// every reader's horizon while it runs, so a hung handler must fail
	// (and be retried, or go dead) rather than stall the fleet.
	spanCtx, span := d.startBatchSpan(ctx, sh, st.attempts, events, replaying)
	defer span.End()
	handlerCtx, cancel := context.WithTimeout(spanCtx, cfg.BatchTimeout)
	defer cancel()
	r := newRun(d, tx, sh, projector.SystemTenant, handlerCtx)
	// The savepoint sent with the lock predates the parked rows, which a
	// handler's failure must not roll back.
	r.savepointed = sh.shadow == nil && ap.parked == 0
	if replaying {
		r.handlerCtx = withReplay(r.handlerCtx, sh.replayState())
	}
	rest := events
	for len(rest) > 0 {
		k, herr := r.applyUntil(ctx, rest, 0)
		if (r.timedOut || r.abort != nil) && errors.Is(handlerCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil && r.current != nil {
			res, err := d.batchTimedOut(ctx, tx, sh, st, events, *r.current, herr, started, ap.gap)
			return res, true, err
		}
		if r.abort != nil {
			return passResult{}, true, r.abort
		}
		if k < 0 {
			ap.done = append(ap.done, rest...)
			break
		}
		ap.done = append(ap.done, rest[:k]...)
		failing := rest[k]
		// Whatever records, logs or traces the failure from here on gets a
		// text without failing's personal values (errortext.go).
		herr = RedactError(herr, OpenedEvents(d.store.Registry(), failing)...)
		batchEventFailed(span, failing, herr)
		if handlerLostConflict(herr) {
			// A deadlock's victim or a serialization failure says nothing
			// about the event: counted, it would dead-letter or park a
			// healthy event (at once in continuous mode). The whole pass
			// rolls back, releasing what it held so the other transaction
			// finishes, and runs again after the dispatcher's backoff.
			return passResult{}, true, &conflictError{event: failing, err: herr}
		}
		if err := r.unscope(ctx); err != nil {
			return passResult{}, true, err
		}
		if attempts := failedAttempts(st, failing); sh.parking() && !IsSystemic(herr) && attempts >= cfg.MaxAttempts {
			var n int
			if rest, n, err = d.parkFailed(ctx, tx, sh, failing, herr, attempts, rest[k+1:]); err != nil {
				return passResult{}, true, err
			}
			ap.parked += n
			continue
		}
		if cfg.ErrorMode != SkipApplyErrors || IsSystemic(herr) {
			if ap.gap {
				res, err := d.switchFailed(ctx, tx, sh, st, failing, herr, started)
				return res, true, err
			}
			// A systemic failure would fail every event behind this one:
			// dead-lettering them all would bury the cause, so the shard
			// stops here in either mode (recordFailure).
			res, err := d.recordFailure(ctx, tx, sh, st.attempts, st.failedEvent, failing, herr, ap.done, started)
			return res, true, err
		}
		if _, err := tx.Exec(ctx, d.sql.deadLetter, sh.id.Consumer, sh.id.Instance, [16]byte(failing.ID), failing.Position.TxID,
			failing.Position.Seq, failing.Type, failing.Stream.Tenant, failing.Stream.Type, failing.Stream.ID, failing.Version,
			StoredError(herr)); err != nil {
			return passResult{}, true, fmt.Errorf("write dead letter: %w", err)
		}
		ap.deadLetters++
		d.logger.WarnContext(ctx, "projection dispatcher: event dead-lettered (continuous mode)",
			slog.String("consumer", sh.id.String()), slog.String("event_id", failing.ID.String()),
			slog.String("type", failing.Type), slog.Any("error", herr))
		rest = rest[k+1:]
	}
	if err := r.unscope(ctx); err != nil {
		return passResult{}, true, err
	}
	return passResult{}, false, nil
}

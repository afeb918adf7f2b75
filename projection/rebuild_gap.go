package projection

// The switching pass of a partitioned consumer whose partitions stand apart
// (docs/rebuilds.md, "A live consumer behind the shadow").
//
// Holding every partition's lock, so no frontier moves, it reads the gap
// from the shadow's cursor (the earliest partition's frontier) on to the
// latest partition's, one shadow batch after another, and applies, as
// replays, only the events at or below their own partition's frontier
// (capShadow), each batch under a deadline of its own. Then it switches
// in the same transaction: every partition keeps its own cursor, at the
// new version, with nothing to replay, so no reader sees a stream go
// back. The shadow's cursor has passed events it left to their partitions,
// so the pass switches or rolls back as a whole: readers holding the live
// tables, a timeout or a handler failure roll it back, and nothing of it
// stays but a failure recorded on the shadow shard with its cursor where
// the pass found it (switchFailed); the switch is tried again.
//
// A crash mid-switch loses the transaction and nothing else: the shadow's
// cursor is where it was, and the next switching pass reads the gap again.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// switchThroughGap ends a switching shadow pass that left events to their
// partitions: batch is its first batch (read with q, already cut by
// capShadow, its cursor then at next); it applies it and every later batch
// of the gap up to the latest partition's frontier, then switches in tx.
func (d *Dispatcher) switchThroughGap(ctx context.Context, tx pgx.Tx, sh *shard, st shardRow, q postgres.LogQuery,
	batch postgres.LogBatch, next projector.Position,
) (passResult, error) {
	started := time.Now()
	ap := batchApply{gap: true}
	batches := 1
	for {
		if sh.parking() {
			var n int
			var err error
			if batch.Events, n, err = d.parkHeld(ctx, tx, sh, batch.Events); err != nil {
				return passResult{}, err
			}
			ap.parked += n
		}
		if res, ended, err := d.applyEvents(ctx, tx, sh, st, batch.Events, true, &ap, started); ended || err != nil {
			return res, err
		}
		if !batch.Full {
			break // capShadow cut it at the latest frontier
		}
		from := next
		q.After = from
		var err error
		if batch, err = d.readBatch(ctx, tx, sh, q); err != nil {
			return passResult{}, err
		}
		if next, _, err = d.capShadow(ctx, tx, sh, true, &batch, from, batch.Next(from)); err != nil {
			return passResult{}, err
		}
		batches++
	}
	switched, err := d.switchShadow(ctx, tx, sh, st.cursor, next)
	if err != nil {
		return passResult{}, err
	}
	if !switched {
		return sh.skippedNoSwitch(), nil // rolled back by the pass
	}
	res, err := d.commit(ctx, tx, sh, passGone, ap.done, 0, ap.deadLetters, started)
	if err != nil {
		return res, err
	}
	d.logger.InfoContext(ctx, "projection dispatcher: rebuild switched; the new version is live",
		slog.String("consumer", sh.id.Consumer), slog.Int("version", sh.proj.cfg.Version), slog.String("cursor", next.String()),
		slog.Int("gap_batches", batches), slog.Int("gap_events", len(ap.done)), slog.Duration("partitions_held", time.Since(started)))
	if sh.proj.cfg.External != nil {
		d.finishSwap(ctx, sh)
	}
	return res, nil
}

// switchFailed handles a handler failure (one the projection's ErrorMode
// does not dead-letter or park) in a switching pass's gap: the switch is
// refused. The pass rolls back, since its cursor could not stop before
// failing with events left to their partitions behind it; the failure is
// recorded on the shadow shard with its cursor where the pass found it, so
// it is retried with backoff, and goes dead after MaxAttempts, like any
// failure of a new version. The live model keeps serving meanwhile, and
// no partition is ever switched behind its own cursor.
func (d *Dispatcher) switchFailed(ctx context.Context, tx pgx.Tx, sh *shard, st shardRow, failing projector.Event, herr error,
	started time.Time,
) (passResult, error) {
	_ = tx.Rollback(context.WithoutCancel(ctx))
	d.logger.WarnContext(ctx, "projection dispatcher: rebuild switch refused: the new version failed on an event a partition further on had handled live; the switch is retried after the failure's backoff (docs/rebuilds.md)",
		slog.String("consumer", sh.id.Consumer), slog.String("event_id", failing.ID.String()),
		slog.String("position", failing.Position.String()), slog.Any("error", herr))
	res, err := d.recordFailureApart(ctx, sh, st, st.cursor, failing, herr, started)
	if err != nil {
		return res, fmt.Errorf("rebuild switch: %w", err)
	}
	return res, nil
}

// advanceShadowSQL is the cursor advance of a shadow shard (c is the
// qualified projector_consumers), with the arguments of the advance: a
// failure it records stands until its cursor passes the failing event. A
// refused switch records its failure with the shadow's cursor where the
// pass found it (switchFailed), before the failing event, which the
// passes between two switching tries do not reach (they stop at the
// earliest partition's frontier): clearing the failure there, as a live
// shard's advance does, would start its attempts over at every such pass,
// and a switch refused on every try would never go dead after MaxAttempts.
func advanceShadowSQL(c string) string {
	keep := `(failed_tx_id IS NOT NULL AND ($3::xid8, $4::bigint) < (failed_tx_id, failed_seq))`
	return `UPDATE ` + c + ` SET cursor_tx_id = $3, cursor_seq = $4,
			status = CASE WHEN ` + keep + ` AND attempts > 0 THEN status ELSE $5 END,
			attempts = CASE WHEN ` + keep + ` THEN attempts ELSE 0 END,
			last_error = CASE WHEN ` + keep + ` THEN last_error END,
			last_error_at = CASE WHEN ` + keep + ` THEN last_error_at END,
			failed_tx_id = CASE WHEN ` + keep + ` THEN failed_tx_id END,
			failed_seq = CASE WHEN ` + keep + ` THEN failed_seq END,
			failed_event_id = CASE WHEN ` + keep + ` THEN failed_event_id END,
			next_retry_at = CASE WHEN ` + keep + ` THEN next_retry_at END,
			processed = processed + $6, updated_at = now()
		WHERE name = $1 AND instance_id = $2`
}

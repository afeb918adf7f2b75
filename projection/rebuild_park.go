package projection

// Parks across a blue/green rebuild (docs/rebuilds.md, "Parked streams
// across a rebuild"). A ParkStream projection's shadow shard parks like a
// live one, under its own instance (RebuildInstance), so a new version that
// still fails on a stream reaches its switch and the other streams go on.
// The switch, in its transaction, closes the live model's parks (the shadow
// replayed their events: it applied them, or parked them anew) and hands the
// shadow's open parks to the live shards, whose passes then hold the
// stream's later events behind them and whose retries apply them through
// the new version.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrParkNotLive: the park was recorded by a blue/green rebuild's shadow
// shard, whose model is not live: there are no live tables to retry it
// into. The switch hands it to the live shard; retry it then. It matches
// [projector.ErrInvalidTransition] too.
var ErrParkNotLive = fmt.Errorf("%w: the park belongs to a rebuild's shadow model, which is not live yet", projector.ErrInvalidTransition)

func shadowParkErr(pk Park) error {
	return fmt.Errorf("retry park %d of %s: %w; the rebuild's switch hands it to the live consumer, retry it then (or cancel the rebuild)",
		pk.ID, projector.Printable(pk.Consumer), ErrParkNotLive)
}

// handOverParks, in the switch's transaction (which holds the shadow's and
// every live shard's lock, so no pass or retry moves a park meanwhile):
//
//   - closes the live shards' open parks as resolved: the shadow replayed
//     their events through the new version, which applied them or parked
//     them again (said in the record), so a retry of the old park would
//     apply them twice;
//   - moves the shadow's open parks to the live shard of their stream (a
//     partitioned consumer: the partition whose segment holds it), with
//     their sequences and the new version's error, so the live consumer
//     holds exactly the streams the new version could not apply, in order.
//
// The live cursors move to the shadow's in the same transaction, so every
// event the shadow read is applied in the new model or held in one of
// these parks, and every later one is read by a live pass that finds the
// park: never applied ahead of it (promise 18).
func (d *Dispatcher) handOverParks(ctx context.Context, tx pgx.Tx, sh *shard) error {
	pt, et := d.store.Table("projector_parks"), d.store.Table("projector_parked_events")
	live := instances(sh.shadow.live)
	if err := d.warnNeverEmitted(ctx, tx, sh, live); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `WITH resolved AS (
			UPDATE `+pt+` p SET status = 'resolved', resolved_at = now(), retry_requested_at = NULL,
				resolved_by = $3 || coalesce((SELECT '; still failing: handed over as park ' || s.id FROM `+pt+` s
					WHERE s.consumer = p.consumer AND s.instance_id = $4 AND s.status = 'parked' AND s.tenant_id = p.tenant_id
					  AND s.stream_type = p.stream_type AND s.stream_id = p.stream_id AND s.kind = p.kind), '') || ')',
				events = (SELECT count(*) FROM `+et+` e WHERE e.park_id = p.id)
			WHERE p.consumer = $1 AND p.instance_id = ANY($2) AND p.status = 'parked' RETURNING p.id)
		DELETE FROM `+et+` WHERE park_id IN (SELECT id FROM resolved)`,
		sh.id.Consumer, live, fmt.Sprintf("rebuild %d (replayed by the switch", sh.shadow.rebuildID), RebuildInstance)
	if err != nil {
		return fmt.Errorf("switch: resolve the live shard's parks: %w", err)
	}
	resolvedEvents := tag.RowsAffected()
	if sh.proj.cfg.Partitions > 1 {
		// To the partition whose segment holds the stream, as the shadow's
		// dead letters go (handOverDeadLetters).
		part := `substr(p.instance_id, ` + strconv.Itoa(len(PartitionPrefix)+1) + `)`
		tag, err = tx.Exec(ctx, `UPDATE `+pt+` pk SET instance_id = p.instance_id, retry_requested_at = NULL
			FROM (SELECT p.instance_id, split_part(`+part+`, '/', 1)::bigint AS v, split_part(`+part+`, '/', 2)::bigint AS n
				FROM `+d.store.Table("projector_consumers")+` p WHERE p.name = $1 AND p.instance_id = ANY($3)) p
			WHERE pk.consumer = $1 AND pk.instance_id = $2 AND pk.status = 'parked'
				AND (`+d.store.Table("projector_stream_hash")+`(pk.tenant_id, pk.stream_type, pk.stream_id) * p.n) >> 32 = p.v`,
			sh.id.Consumer, RebuildInstance, live)
	} else {
		tag, err = tx.Exec(ctx, `UPDATE `+pt+` SET instance_id = $3, retry_requested_at = NULL
			WHERE consumer = $1 AND instance_id = $2 AND status = 'parked'`, sh.id.Consumer, RebuildInstance, SharedInstance)
	}
	if err != nil {
		return fmt.Errorf("switch: hand the shadow shard's parks to the live shards: %w", err)
	}
	if tag.RowsAffected() > 0 || resolvedEvents > 0 {
		d.logger.InfoContext(ctx, "projection dispatcher: rebuild switch: the old model's parks are resolved (replayed), the streams the new version still fails on stay parked",
			slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", sh.shadow.rebuildID),
			slog.Int64("handed_over", tag.RowsAffected()), slog.Int64("old_parked_events_replayed", resolvedEvents))
	}
	return nil
}

// warnNeverEmitted says, before the switch resolves the live model's
// parks, how many of their events the new version applied in the shadow
// although the live model never applied them live (it parked them, past
// its live mark): the shadow applied them as replays, so what their
// handlers Emit is never appended (docs/rebuilds.md, "Emit across the
// switch": running the handlers live for them from the shadow would
// append while the old model is live, and a retry of its park or a
// cancelled rebuild would emit them again). The events the new version
// parked again are handed over and emitted by their retry.
func (d *Dispatcher) warnNeverEmitted(ctx context.Context, tx pgx.Tx, sh *shard, live []string) error {
	pt, et := d.store.Table("projector_parks"), d.store.Table("projector_parked_events")
	var events, parks int64
	if err := tx.QueryRow(ctx, `SELECT count(*), count(DISTINCT p.id) FROM `+pt+` p JOIN `+et+` e ON e.park_id = p.id
		WHERE p.consumer = $1 AND p.instance_id = ANY($2) AND p.status = 'parked'
		  AND e.version >= p.version AND e.version > coalesce(p.live_through, 0)
		  AND NOT EXISTS (SELECT FROM `+pt+` s WHERE s.consumer = p.consumer AND s.instance_id = $3 AND s.status = 'parked'
			AND s.tenant_id = p.tenant_id AND s.stream_type = p.stream_type AND s.stream_id = p.stream_id AND s.kind = p.kind
			AND s.version <= e.version)`, sh.id.Consumer, live, RebuildInstance).Scan(&events, &parks); err != nil {
		return fmt.Errorf("switch: count the live model's parked events the new version applied: %w", err)
	}
	if events > 0 {
		d.logger.WarnContext(ctx, "projection dispatcher: rebuild switch: the new version applied events the old model had parked, as replays: their Emit calls appended nothing (docs/rebuilds.md)",
			slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", sh.shadow.rebuildID),
			slog.Int64("events", events), slog.Int64("parks", parks))
	}
	return nil
}

// markLiveThrough, in the switch's transaction before the live cursors
// move, sets the live mark of each of the shadow's open parks (migration
// 27): the stream version through which the live model applied the
// stream's events live, and so appended what their handlers Emit. The
// shadow parked the stream from the event its new version fails on, which
// the live model may have applied, with later ones: a retry after the
// switch must give those to the handlers as replays (applyParked), or an
// Emit would append for them twice. The live model applied a stream's
// events live
//
//   - up to the event its own open park of the stream failed on (or that
//     park's mark, handed over by an earlier switch, if higher): it held
//     the rest;
//   - else up to the last event of the stream at or below the cursor of
//     its shard holding the stream (a partitioned consumer: the partition
//     whose segment holds it), the hot log's or the archive's — or below
//     the shard's replay mark, if further on (frontierSQL: a model before
//     applied those live).
//
// Events the live model never read (past its cursor) or held stay live
// for the retry. A stream the live model's parks lost events of by a
// discard is not told apart: those events were never applied live, and
// stay below the mark (docs/rebuilds.md says so).
func (d *Dispatcher) markLiveThrough(ctx context.Context, tx pgx.Tx, sh *shard) error {
	pt := d.store.Table("projector_parks")
	// The live shards with their segments (partitions: "v/n"; the CASE
	// keeps the casts off any other row), and the one holding a stream.
	pre, part := PartitionPrefix+"%", `substr(c.instance_id, `+strconv.Itoa(len(PartitionPrefix)+1)+`)`
	ftx, fseq := frontierSQL("c")
	live := `(SELECT c.instance_id, ` + ftx + ` AS cursor_tx_id, ` + fseq + ` AS cursor_seq,
			CASE WHEN c.instance_id LIKE '` + pre + `' THEN split_part(` + part + `, '/', 1)::bigint END AS v,
			CASE WHEN c.instance_id LIKE '` + pre + `' THEN split_part(` + part + `, '/', 2)::bigint END AS n
		FROM ` + d.store.Table("projector_consumers") + ` c WHERE c.name = $1 AND c.instance_id = ANY($3))`
	holds := `c.instance_id = '` + SharedInstance + `'`
	if sh.proj.cfg.Partitions > 1 {
		holds = `(` + d.store.Table("projector_stream_hash") + `(s.tenant_id, s.stream_type, s.stream_id) * c.n) >> 32 = c.v`
	}
	read := func(table string) string {
		return `(SELECT max(e.version) FROM ` + d.store.Table(table) + ` e WHERE e.tenant_id = s.tenant_id AND e.stream_type = s.stream_type
			AND e.stream_id = s.stream_id AND (e.tx_id, e.seq) <= (c.cursor_tx_id, c.cursor_seq))`
	}
	tag, err := tx.Exec(ctx, `UPDATE `+pt+` s SET live_through = m.v FROM (
			SELECT s.id, coalesce(
				(SELECT max(greatest(o.version - 1, o.live_through)) FROM `+pt+` o
					WHERE o.consumer = s.consumer AND o.instance_id = ANY($3) AND o.status = 'parked' AND o.tenant_id = s.tenant_id
					  AND o.stream_type = s.stream_type AND o.stream_id = s.stream_id AND o.kind = s.kind),
				greatest(`+read("projector_events")+`, `+read("projector_events_archive")+`)) AS v
			FROM `+pt+` s JOIN `+live+` c ON `+holds+`
			WHERE s.consumer = $1 AND s.instance_id = $2 AND s.status = 'parked') m
		WHERE s.id = m.id AND m.v > 0`, sh.id.Consumer, RebuildInstance, instances(sh.shadow.live))
	if err != nil {
		return fmt.Errorf("switch: mark what the live model applied of the shadow's parked streams: %w", err)
	}
	if n := tag.RowsAffected(); n > 0 {
		d.logger.DebugContext(ctx, "projection dispatcher: rebuild switch: parks handed over with events the live model applied; a retry replays those",
			slog.String("consumer", sh.id.Consumer), slog.Int64("parks", n))
	}
	return nil
}

// DiscardShadowParks closes, in tx, the open parks of the shadow shard of
// consumer's blue/green rebuild rebuildID, which is being cancelled: its
// model never goes live, so nothing is left to apply them to. They are
// marked discarded with who (the rebuild), kept for the record; the live
// model's own parks are untouched. The caller holds the shadow shard's
// lock.
func DiscardShadowParks(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string, rebuildID int64) error {
	pt, et := store.Table("projector_parks"), store.Table("projector_parked_events")
	_, err := tx.Exec(ctx, `WITH discarded AS (
			UPDATE `+pt+` p SET status = 'discarded', resolved_at = now(), retry_requested_at = NULL, resolved_by = $3,
				events = (SELECT count(*) FROM `+et+` e WHERE e.park_id = p.id)
			WHERE p.consumer = $1 AND p.instance_id = $2 AND p.status = 'parked' RETURNING p.id)
		DELETE FROM `+et+` WHERE park_id IN (SELECT id FROM discarded)`,
		consumer, RebuildInstance, fmt.Sprintf("rebuild %d (cancelled: its model never went live)", rebuildID))
	if err != nil {
		return fmt.Errorf("discard the parks of rebuild %d's shadow shard: %w", rebuildID, err)
	}
	return nil
}

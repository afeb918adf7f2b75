package projection

// How far a blue/green rebuild's shadow replays (docs/rebuilds.md, "A live
// consumer behind the shadow").
//
// The shadow applies every event as a replay: SkipOnReplay handlers do not
// run and Emit appends nothing, which is right only for an event a version
// before handled live. So the shadow replays no further than the live
// model has handled events: up to each live shard's frontier (its cursor,
// or the replay mark it still replays up to). Having caught up with it,
// the shadow switches, and the new version handles every later event from
// the live shard, live. If the old version's processes stopped, the shadow
// reaches their cursors, switches, and the new version carries on from
// them: no event is applied as a replay without a version having handled
// it live, nor handled live twice.
//
// A partitioned consumer's partitions each have a frontier of their own,
// and an event is a replay only at or below its own partition's. Outside
// the switch (no partition lock held, so every frontier may still move)
// the shadow's passes stop at the earliest frontier. The switching pass,
// which holds every partition's lock, reads on to the latest, batch after
// batch however many it takes (rebuild_gap.go), and applies only the events
// at or below their own partition's frontier, leaving the others to their
// partition; it must then switch in that transaction (or roll back, a
// handler failure included), since its cursor has passed events it did
// not apply. Each partition keeps its own cursor, and none has anything
// to replay after the switch.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// frontierSQL returns the SQL expressions of how far the live shard row
// alias has handled events live: its cursor, or the replay mark it still
// replays up to (an in-place rebuild's, or an earlier switch's), whichever
// is later.
func frontierSQL(alias string) (txID, seq string) {
	later := `CASE WHEN ` + alias + `.replay_until_tx_id IS NOT NULL AND (` + alias + `.replay_until_tx_id, ` + alias + `.replay_until_seq) > (` +
		alias + `.cursor_tx_id, ` + alias + `.cursor_seq) THEN ` + alias + `.replay_until_`
	return later + `tx_id ELSE ` + alias + `.cursor_tx_id END`, later + `seq ELSE ` + alias + `.cursor_seq END`
}

// liveFrontier is a live shard of a consumer a shadow builds for, with how
// far it handled events live.
type liveFrontier struct {
	instance string
	// segment holds the partition's streams (or keys); partitioned is
	// false for the unpartitioned shard.
	segment     postgres.Segment
	partitioned bool
	at          projector.Position
}

// liveFrontiers reads, in tx, the frontiers of the live shards of sh's
// consumer: the unpartitioned shard's, or each partition's when the fence
// says the consumer is partitioned. None when it has no live shard, which
// no switch takes either.
func (d *Dispatcher) liveFrontiers(ctx context.Context, tx pgx.Tx, sh *shard) ([]liveFrontier, error) {
	ftx, fseq := frontierSQL("c")
	rows, err := tx.Query(ctx, `WITH live AS (
			SELECT c.instance_id, c.version, `+ftx+` AS tx_id, `+fseq+` AS seq FROM `+d.store.Table("projector_consumers")+` c
			WHERE c.name = $1 AND (c.instance_id = $2 OR starts_with(c.instance_id, $3)))
		SELECT l.instance_id, l.tx_id, l.seq FROM live l
		WHERE CASE WHEN EXISTS (SELECT FROM live f WHERE f.instance_id = $2 AND f.version = $4)
			THEN starts_with(l.instance_id, $3) ELSE l.instance_id = $2 END`,
		sh.id.Consumer, SharedInstance, PartitionPrefix, PartitionedVersion)
	if err != nil {
		return nil, fmt.Errorf("shadow pass: read the live cursors: %w", err)
	}
	var out []liveFrontier
	var f liveFrontier
	if _, err := pgx.ForEachRow(rows, []any{&f.instance, &f.at.TxID, &f.at.Seq}, func() error {
		f.segment, f.partitioned = postgres.Segment{}, false
		if p, n, ok := ParsePartition(f.instance); ok {
			seg, err := postgres.SegmentOf(p, n)
			if err != nil {
				return err
			}
			f.segment, f.partitioned = seg, true
		}
		out = append(out, f)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("shadow pass: read the live cursors: %w", err)
	}
	return out, nil
}

// capShadow cuts a shadow pass's batch, read after cursor, to what the
// live model handled live, and returns where the shadow's cursor moves to
// and whether the pass leaves events to their partitions, in which case it
// must switch in its transaction or roll back: its cursor may pass events
// it did not apply, or the earliest partition's frontier.
//
// A pass stops at the earliest live frontier; a switching pass of a
// partitioned consumer whose partitions stand apart, holding every
// partition's lock, at the latest, keeping only the events at or below
// their own partition's frontier; it calls capShadow again for each later
// batch of that gap (switchThroughGap). A shadow already past a frontier
// (started by a release that replayed to the log's end, or a cursor moved
// back since) stays where it is; the switch says so.
func (d *Dispatcher) capShadow(ctx context.Context, tx pgx.Tx, sh *shard, switching bool, batch *postgres.LogBatch, cursor, next projector.Position) (projector.Position, bool, error) {
	fs, err := d.liveFrontiers(ctx, tx, sh)
	if err != nil || len(fs) == 0 {
		return next, false, err
	}
	earliest, latest := fs[0].at, fs[0].at
	for _, f := range fs[1:] {
		if f.at.Less(earliest) {
			earliest = f.at
		}
		if latest.Less(f.at) {
			latest = f.at
		}
	}
	skip := switching && fs[0].partitioned && earliest != latest
	reach := earliest
	if skip {
		reach = latest
	}
	if reach.Less(cursor) {
		reach = cursor
	}
	next = holdBatch(batch, next, reach)
	if !skip {
		return next, false, nil
	}
	kept := batch.Events[:0:0]
	for _, ev := range batch.Events {
		h := d.partitionHash(sh.proj, ev)
		i := slices.IndexFunc(fs, func(f liveFrontier) bool { return f.segment.Contains(h) })
		if i < 0 || !fs[i].at.Less(ev.Position) {
			kept = append(kept, ev) // a partition that handled it (or none holds it: never left to no one)
		}
	}
	batch.Events = kept
	return next, true, nil
}

// partitionHash is the hash that places ev in a partition of p's
// consumer: its stream's, or its partition key's (ownEvents).
func (d *Dispatcher) partitionHash(p *Async, ev projector.Event) uint32 {
	h := postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID)
	if key := p.cfg.PartitionKey; key != nil {
		if err := decodeEvent(d.store.Registry(), p.cfg.RawPayloads, &ev); err == nil {
			if k, err := key(ev); err == nil {
				h = postgres.StreamHash(ev.Stream.Tenant, p.name, k)
			}
		}
	}
	return h
}

// errFrontierPastSwitch is a switch refused because a live shard had
// handled events live past the switch's cursor, which the switching pass's
// locks rule out (they keep every live frontier where capShadow read it):
// something moved a live cursor outside a pass (SQL, a tool that ignores
// the shard locks). Switching it back to the shadow's cursor would let
// readers see its streams go back, so the switch is rolled back, loudly,
// and the next switching pass reads the frontiers again.
var errFrontierPastSwitch = errors.New("a live shard's cursor is past the switch's: it moved while the switch held its lock")

// moveLiveCursors, in the switch's transaction, gives the live shards
// (every partition's row, for a partitioned consumer) the new version and
// a cursor: the shadow applied every event up to from (its cursor before
// this pass) and, of those up to next, each one at or below its shard's
// frontier. So a shard whose frontier lies between from and next keeps
// it, which is every shard since a switching pass reads on to the latest
// frontier (switchThroughGap); one behind from (the shadow replayed past
// it: the events between were handled live by no version, which is said)
// takes from. One further on than next cannot be under the pass's locks:
// the switch is refused with errFrontierPastSwitch, never switched with
// its cursor behind what readers saw.
func (d *Dispatcher) moveLiveCursors(ctx context.Context, tx pgx.Tx, sh *shard, from, next projector.Position) error {
	c := d.store.Table("projector_consumers")
	live := instances(sh.shadow.live)
	ftx, fseq := frontierSQL("l")
	frontier := `(` + ftx + `, ` + fseq + `)`
	before := frontier + ` < ($3::xid8, $4::bigint)`
	var behind int
	var past []string
	if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE `+before+`),
			coalesce(array_agg(l.instance_id ORDER BY l.instance_id) FILTER (WHERE `+frontier+` > ($5::xid8, $6::bigint)), '{}')
		FROM `+c+` l WHERE l.name = $1 AND l.instance_id = ANY($2)`,
		sh.id.Consumer, live, from.TxID, from.Seq, next.TxID, next.Seq).Scan(&behind, &past); err != nil {
		return fmt.Errorf("switch: read the live cursors: %w", err)
	}
	if len(past) > 0 {
		d.logger.ErrorContext(ctx, "projection dispatcher: rebuild switch refused: a live shard had handled events past the switch's cursor, though the switch held its lock (moved outside a pass?); the switch is rolled back and tried again",
			slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", sh.shadow.rebuildID), slog.Any("shards", past),
			slog.String("cursor", next.String()))
		return fmt.Errorf("switch of %s: %v: %w", sh.id.Consumer, past, errFrontierPastSwitch)
	}
	if behind > 0 {
		d.logger.WarnContext(ctx, "projection dispatcher: rebuild switch: the shadow had replayed past live cursors (a rebuild started by an earlier release, or a cursor moved back): the events between were handled live by no version, their Emit calls appended nothing (docs/rebuilds.md)",
			slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", sh.shadow.rebuildID), slog.Int("shards", behind))
	}
	// A disabled live shard stays disabled (ignored until `consumer
	// enable`, as after an in-place rewind); any other state was the old
	// model's, and the new one starts idle. None replays: its cursor is
	// its frontier, at or past any replay mark.
	if _, err := tx.Exec(ctx, `UPDATE `+c+` l SET version = $5,
			cursor_tx_id = CASE WHEN `+before+` THEN $3 ELSE `+ftx+` END,
			cursor_seq = CASE WHEN `+before+` THEN $4 ELSE `+fseq+` END,
			replay_until_tx_id = NULL, replay_until_seq = NULL,
			status = CASE WHEN l.status = 'disabled' THEN 'disabled' ELSE 'idle' END, attempts = 0,
			last_error = NULL, last_error_at = NULL, failed_tx_id = NULL, failed_seq = NULL, failed_event_id = NULL,
			next_retry_at = NULL, updated_at = now()
		WHERE l.name = $1 AND l.instance_id = ANY($2)`,
		sh.id.Consumer, live, from.TxID, from.Seq, sh.proj.cfg.Version); err != nil {
		return fmt.Errorf("switch: move the live cursors: %w", err)
	}
	return nil
}

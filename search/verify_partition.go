package search

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Verifying a partitioned search projection (AsyncConfig.Partitions).
//
// Such a consumer has no one cursor: each partition applied the events of
// its own streams up to its own cursor, and its unpartitioned row is only
// the fence, whose cursor never moves. A document is written by the events
// of a stream, and a stream lives in one partition, so the index holds a
// document as of that partition's cursor. Verify therefore replays each
// event only if its position is at or below the cursor of the partition
// its stream (or, partitioned by key, its key) hashes into, and compares
// the result with the index.
//
// The cursors are read in one statement, so they are one consistent view
// of the partitions' rows even while one splits or merges. A split child
// starts at its parent's cursor and siblings merge at equal cursors, so
// the cursor at any hash only ever moves forward: a replay that continues
// from an earlier view (when the index moved while Verify read it) adds,
// per event, what its partition applied since.

// PartitionCursor is where one partition of a partitioned consumer stood
// when [Verify] compared its documents.
type PartitionCursor struct {
	// Partition is "p/N", as status shows it.
	Partition string
	Cursor    projector.Position
}

// partCursor is one partition's row: its hash segment and cursor.
type partCursor struct {
	seg postgres.Segment
	at  projector.Position
}

// cursors is a consumer's position: one cursor, or one per partition
// (parts non-nil).
type cursors struct {
	one   projector.Position
	parts []partCursor
}

// partitioned reports whether c is a partitioned consumer's view.
func (c cursors) partitioned() bool { return c.parts != nil }

// at returns the cursor of the partition holding hash h.
func (c cursors) at(h uint32) (projector.Position, bool) {
	for _, pc := range c.parts {
		if pc.seg.Contains(h) {
			return pc.at, true
		}
	}
	return projector.Position{}, false
}

// low and high are the lowest and highest cursor.
func (c cursors) low() projector.Position {
	if !c.partitioned() {
		return c.one
	}
	lo := c.parts[0].at
	for _, pc := range c.parts[1:] {
		if pc.at.Less(lo) {
			lo = pc.at
		}
	}
	return lo
}

func (c cursors) high() projector.Position {
	if !c.partitioned() {
		return c.one
	}
	hi := c.parts[0].at
	for _, pc := range c.parts[1:] {
		if hi.Less(pc.at) {
			hi = pc.at
		}
	}
	return hi
}

// equal reports whether c and d are the same view.
func (c cursors) equal(d cursors) bool {
	return c.one == d.one && c.partitioned() == d.partitioned() && slices.Equal(c.parts, d.parts)
}

// shards are the shards of consumer whose passes move c: its one shard,
// or each partition.
func (c cursors) shards(consumer string) []projection.ShardID {
	if !c.partitioned() {
		return []projection.ShardID{{Consumer: consumer, Instance: projection.SharedInstance}}
	}
	ids := make([]projection.ShardID, len(c.parts))
	for i, pc := range c.parts {
		ids[i] = projection.ShardID{Consumer: consumer, Instance: projection.PartitionInstance(int(pc.seg.Value), pc.seg.Count())}
	}
	return ids
}

// report returns the partitions' cursors as a report shows them.
func (c cursors) report() []PartitionCursor {
	if !c.partitioned() {
		return nil
	}
	out := make([]PartitionCursor, len(c.parts))
	for i, pc := range c.parts {
		out[i] = PartitionCursor{Partition: pc.seg.String(), Cursor: pc.at}
	}
	return out
}

// readCursors reads the consumer's position: the cursor of its one shard,
// or, when that row is a partitioned consumer's fence, every partition's
// cursor, read in one statement.
func readCursors(ctx context.Context, store *postgres.Store, admin *projection.Admin, id projection.ShardID) (cursors, error) {
	st, err := admin.Status(ctx, id)
	if err != nil {
		return cursors{}, err
	}
	if !st.Fence() {
		return cursors{one: st.Cursor}, nil
	}
	rows, err := store.Pool().Query(ctx, `SELECT instance_id, cursor_tx_id, cursor_seq FROM `+store.Table("projector_consumers")+`
		WHERE name = $1 AND instance_id LIKE '`+projection.PartitionPrefix+`%'`, id.Consumer)
	if err != nil {
		return cursors{}, fmt.Errorf("read the partitions' cursors: %w", err)
	}
	type row struct {
		instance string
		at       projector.Position
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.instance, &x.at.TxID, &x.at.Seq)
		return x, err
	})
	if err != nil {
		return cursors{}, fmt.Errorf("read the partitions' cursors: %w", err)
	}
	c := cursors{parts: make([]partCursor, 0, len(got))}
	for _, r := range got {
		p, n, ok := projection.ParsePartition(r.instance)
		if !ok {
			continue
		}
		seg, err := postgres.SegmentOf(p, n)
		if err != nil {
			continue
		}
		c.parts = append(c.parts, partCursor{seg: seg, at: r.at})
	}
	if len(c.parts) == 0 {
		return cursors{}, fmt.Errorf("%w (consumer %s is partitioned and has no partition yet: start a dispatcher that runs it)", ErrPartitioned, projector.Printable(id.Consumer))
	}
	slices.SortFunc(c.parts, func(a, b partCursor) int {
		return projection.PartitionOrder(projection.PartitionInstance(int(a.seg.Value), a.seg.Count()), projection.PartitionInstance(int(b.seg.Value), b.seg.Count()))
	})
	return c, nil
}

// eventHash is where ev belongs when p runs partitioned: its stream's
// hash, or, with a partition key, the key's (the dispatcher's placement:
// an event whose key function fails belongs to its stream's partition).
func (p *Projection) eventHash(ev projector.Event) uint32 {
	if key := p.cfg.Async.PartitionKey; key != nil {
		if k, err := key(ev); err == nil {
			return projection.KeyHash(ev.Stream.Tenant, p.name, k)
		}
	}
	return postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID)
}

// replaySince applies to m the events the consumer applied between the
// views from and to: for one cursor those in (from, to]; partitioned, each
// event in (from, to] of the partition it belongs to. It returns how many
// it applied.
func (p *Projection) replaySince(ctx context.Context, store *postgres.Store, m *memIndex, from, to cursors) (int, error) {
	lo, hi, keep := p.between(from, to)
	n := 0
	err := p.replayEach(ctx, store, lo, hi, keep, func(w *Writer) error {
		m.apply(w.ops)
		n++
		return nil
	})
	return n, err
}

// between returns the range of the log holding the events the consumer
// applied between the views from and to (from the zero view: since the
// start), and, partitioned, the filter keeping each event in (from, to]
// of its own partition (nil for one cursor).
func (p *Projection) between(from, to cursors) (lo, hi projector.Position, keep func(projector.Event) (bool, error)) {
	if !to.partitioned() {
		return from.one, to.one, nil
	}
	lo = projector.Start
	if from.partitioned() {
		lo = from.low()
	}
	keep = func(ev projector.Event) (bool, error) {
		h := p.eventHash(ev)
		upto, ok := to.at(h)
		if !ok {
			return false, fmt.Errorf("no partition of %s holds event %s of %s (hash %08x): the partitions do not cover every stream", projector.Printable(p.name), ev.ID, ev.Stream, h)
		}
		after := projector.Start
		if from.partitioned() {
			if after, ok = from.at(h); !ok {
				return false, fmt.Errorf("no partition of %s held event %s of %s (hash %08x)", projector.Printable(p.name), ev.ID, ev.Stream, h)
			}
		}
		return after.Less(ev.Position) && !upto.Less(ev.Position), nil
	}
	return lo, to.high(), keep
}

package search

import (
	"context"
	"errors"
	"fmt"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrNotReindexable: the backend cannot build a second index beside the
// live one and swap them ([Swapper]). A PostgreSQL index is reindexed by
// a blue/green rebuild of its consumer instead (`projector rebuild NAME`).
var ErrNotReindexable = errors.New("search: the backend cannot reindex by swapping (for PostgreSQL use projector rebuild)")

// ErrPartitioned: [Reindex] takes over from the consumer's one cursor, and
// a partitioned search projection (AsyncConfig.Partitions) has one per
// partition. Rebuild it blue/green instead (`projector rebuild NAME`,
// docs/rebuilds.md "Partitioned consumers"), or run it unpartitioned to
// reindex. [Verify] returns it only for a partitioned consumer that has no
// partition rows yet (no dispatcher ran it).
var ErrPartitioned = errors.New("search: not built for a partitioned projection yet")

// Swapper is implemented by backends that reindex by building a new index
// beside the live one and swapping the two atomically (Meilisearch's
// swap-indexes).
type Swapper interface {
	// Shadow creates an empty index beside idx's live one, with idx's
	// settings, dropping any left by an earlier attempt, and returns a
	// backend whose writes go to it.
	Shadow(ctx context.Context, idx Index) (Backend, error)
	// Swap makes the shadow idx's live index in one atomic step and then
	// deletes the index it replaced.
	Swap(ctx context.Context, idx Index) error
	// DropShadow deletes the shadow, if there is one.
	DropShadow(ctx context.Context, idx Index) error
}

// RebuildSwapper is implemented by backends whose indexes a blue/green
// rebuild (`projector rebuild NAME`, rebuild.Request) builds beside the
// live one, under a name unique to the rebuild, and swaps in after the
// rebuild's PostgreSQL switch committed (stores/meilisearch). A search
// projection on such a backend is a projection.External: see
// docs/search.md.
type RebuildSwapper interface {
	// RebuildShadow returns a backend that writes to rebuild rebuildID's
	// shadow of each index.
	RebuildShadow(rebuildID int64) Backend
	// PrepareRebuild creates the rebuild's empty shadow of idx with idx's
	// settings, replacing one an earlier attempt left.
	PrepareRebuild(ctx context.Context, idx Index, rebuildID int64) error
	// SwapRebuild makes the shadow idx's live index and deletes the old
	// one. It may run more than once for one rebuild and must recognise a
	// swap that happened, never swapping back.
	SwapRebuild(ctx context.Context, idx Index, rebuildID int64) error
	// DropRebuild deletes the rebuild's shadow of idx, if any.
	DropRebuild(ctx context.Context, idx Index, rebuildID int64) error
}

// external is a search projection on a [RebuildSwapper] backend as its
// dispatcher sees it: a projection.External target.
type external struct {
	p  *Projection
	rs RebuildSwapper
}

func (e external) Kind() string { return e.p.cfg.Backend.Kind() }

func (e external) PrepareShadow(ctx context.Context, rebuildID int64) error {
	return e.rs.PrepareRebuild(ctx, e.p.cfg.Index, rebuildID)
}

func (e external) Swap(ctx context.Context, rebuildID int64) error {
	return e.rs.SwapRebuild(ctx, e.p.cfg.Index, rebuildID)
}

func (e external) DropShadow(ctx context.Context, rebuildID int64) error {
	return e.rs.DropRebuild(ctx, e.p.cfg.Index, rebuildID)
}

// DefaultReindexBatch is how many events [Reindex] replays per write to
// the new index.
const DefaultReindexBatch = 1000

// ReindexReport is what [Reindex] did.
type ReindexReport struct {
	// Events were replayed into the new index: up to Built while live
	// indexing went on, then up to Swapped while it was held.
	Events         int
	Built, Swapped projector.Position
	// Partitions are, for a partitioned projection, the partitions'
	// cursors the new index was swapped in at (Built and Swapped are then
	// the lowest of them).
	Partitions []PartitionCursor
}

// Reindex rebuilds p's index from the log without leaving searches
// without an answer, the way Meilisearch's swap-indexes API is meant for:
//
//  1. it builds a new index beside the live one from the log up to the
//     live consumer's cursor, while the live index keeps being searched
//     and updated;
//  2. it holds live indexing (disables the consumer's shard: the live
//     index is then exactly at the shard's cursor) and brings the new
//     index up to that same cursor;
//  3. it swaps the two atomically, deletes the old one and lets live
//     indexing resume (enables the shard), now into the new index.
//
// Searches are answered by the old index until the swap and by the new
// one after it. If Reindex fails after holding live indexing it enables
// the shard again and drops the new index; if the process dies while
// holding, the shard stays disabled, visibly in `projector status`, until
// an operator enables it (`projector consumer enable NAME`). From the hold
// to the swap it holds the shard's lock, so a dispatcher that would
// partition the consumer (whose partitions would index into the old
// index) waits. Events the
// consumer dead-lettered or an operator skipped are left out, as they were
// of the live index.
func Reindex(ctx context.Context, store *postgres.Store, p *Projection, batch int) (ReindexReport, error) {
	if p.err != nil {
		return ReindexReport{}, p.err
	}
	sw, ok := p.cfg.Backend.(Swapper)
	if !ok {
		return ReindexReport{}, fmt.Errorf("reindex %q: %w (%s)", p.name, ErrNotReindexable, p.cfg.Backend.Kind())
	}
	if batch <= 0 {
		batch = DefaultReindexBatch
	}
	admin := projection.NewAdmin(store)
	id := projection.ShardID{Consumer: p.name, Instance: projection.SharedInstance}
	st, err := admin.Status(ctx, id)
	if err != nil {
		return ReindexReport{}, fmt.Errorf("reindex %q: %w", p.name, err)
	}
	if st.Fence() {
		return p.reindexPartitioned(ctx, store, sw, admin, id, batch)
	}
	if st.Status != projection.StatusIdle && st.Status != projection.StatusProcessing {
		return ReindexReport{}, fmt.Errorf("reindex %q: the consumer is %s; it must be running (idle or processing) so the new index can take over from it: %w",
			p.name, st.Status, projector.ErrInvalidTransition)
	}
	shadow, err := sw.Shadow(ctx, p.cfg.Index)
	if err != nil {
		return ReindexReport{}, fmt.Errorf("reindex %q: create the new index: %w", p.name, err)
	}
	var r ReindexReport
	fail := func(err error) (ReindexReport, error) {
		if derr := sw.DropShadow(context.WithoutCancel(ctx), p.cfg.Index); derr != nil {
			err = errors.Join(err, fmt.Errorf("drop the new index: %w", derr))
		}
		return r, fmt.Errorf("reindex %q: %w", p.name, err)
	}
	n, err := p.replayInto(ctx, store, shadow, projector.Start, st.Cursor, nil, batch)
	r.Events, r.Built = n, st.Cursor
	if err != nil {
		return fail(err)
	}
	if err := admin.Disable(ctx, id); err != nil {
		return fail(fmt.Errorf("hold live indexing: %w", err))
	}
	enable := func() error {
		if err := admin.Enable(context.WithoutCancel(ctx), id); err != nil {
			return fmt.Errorf("resume live indexing (enable it with projector consumer enable %s): %w", p.name, err)
		}
		return nil
	}
	// The shard's lock is the fence lock a starting dispatcher that
	// declares partitions takes to partition the consumer: its partitions
	// would start at the held cursor, running, and index into the index
	// the swap deletes. Held from here to the swap (Enable takes it too),
	// in a transaction with no id (no horizon held back), it makes such a
	// start wait; one that came after the Disable is seen below.
	fence, err := lockFence(ctx, store, p.name)
	if err != nil {
		return fail(errors.Join(err, enable()))
	}
	held, err := admin.Status(ctx, id)
	if err != nil {
		fence.release(ctx)
		return fail(errors.Join(err, enable()))
	}
	if held.Fence() {
		fence.release(ctx)
		return fail(fmt.Errorf("%w: a dispatcher partitioned the consumer while the reindex held it; its partitions index into the live index: run the reindex again: %w",
			projection.ErrLayoutChanged, projector.ErrInvalidTransition))
	}
	n, err = p.replayInto(ctx, store, shadow, st.Cursor, held.Cursor, nil, batch)
	r.Events, r.Swapped = r.Events+n, held.Cursor
	if err == nil {
		err = fence.check(ctx)
	}
	if err != nil {
		fence.release(ctx)
		return fail(errors.Join(err, enable()))
	}
	err = sw.Swap(ctx, p.cfg.Index)
	fence.release(ctx)
	if err != nil {
		return fail(errors.Join(fmt.Errorf("swap: %w", err), enable()))
	}
	// A dispatcher partitioning the consumer from here on starts its
	// partitions at the held cursor, into the swapped-in index: nothing is
	// lost, and the row the enable finds is the fence.
	if err := enable(); err != nil && !partitionedSince(ctx, admin, id) {
		return r, fmt.Errorf("reindex %q: swapped, but %w", p.name, err)
	}
	return r, nil
}

// partitionedSince reports whether the consumer's row is now a
// partitioned consumer's fence (a dispatcher partitioned it after the
// swap, so its partitions run and there is nothing to enable).
func partitionedSince(ctx context.Context, admin *projection.Admin, id projection.ShardID) bool {
	st, err := admin.Status(context.WithoutCancel(ctx), id)
	return err == nil && st.Fence()
}

// replayInto replays the events of p's types in (from, to] that keep (when
// set) keeps into b, batch events per Apply.
func (p *Projection) replayInto(ctx context.Context, store *postgres.Store, b Backend, from, to projector.Position, keep func(projector.Event) (bool, error), batch int) (int, error) {
	var ops []Op
	n, pending := 0, 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		if err := b.Apply(ctx, nil, p.cfg.Index, ops); err != nil {
			return fmt.Errorf("write the new index: %w", err)
		}
		ops, pending = ops[:0], 0
		return nil
	}
	err := p.replayEach(ctx, store, from, to, keep, func(w *Writer) error {
		ops = append(ops, w.ops...)
		n++
		if pending++; pending >= batch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	return n, flush()
}

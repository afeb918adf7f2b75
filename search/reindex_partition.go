package search

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// reindexPartitioned is [Reindex] for a partitioned projection. It works
// as for one cursor, per partition: it builds the new index from the log,
// each event up to its own partition's cursor; holds live indexing by
// disabling every partition (each Disable waits for that partition's
// running batch, so the live index is then exactly at the partitions'
// cursors); brings the new index up to each partition's held cursor;
// swaps; and enables every partition again. A split or merge while it
// holds them fails it with [projection.ErrLayoutChanged] (which matches
// [projector.ErrInvalidTransition]): the new index is dropped, the
// partitions resume, and it can be run again.
func (p *Projection) reindexPartitioned(ctx context.Context, store *postgres.Store, sw Swapper, admin *projection.Admin, id projection.ShardID, batch int) (ReindexReport, error) {
	built, err := readCursors(ctx, store, admin, id)
	if err != nil {
		return ReindexReport{}, fmt.Errorf("reindex %q: %w", p.name, err)
	}
	ids := make([]projection.ShardID, len(built.parts))
	for i, pc := range built.parts {
		ids[i] = projection.ShardID{Consumer: p.name, Instance: projection.PartitionInstance(int(pc.seg.Value), pc.seg.Count())}
		st, err := admin.Status(ctx, ids[i])
		if err != nil {
			return ReindexReport{}, fmt.Errorf("reindex %q: %w", p.name, err)
		}
		if st.Status != projection.StatusIdle && st.Status != projection.StatusProcessing {
			return ReindexReport{}, fmt.Errorf("reindex %q: partition %s is %s; every partition must be running (idle or processing) so the new index can take over from them: %w",
				p.name, pc.seg, st.Status, projector.ErrInvalidTransition)
		}
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
	lo, hi, keep := p.between(cursors{}, built)
	n, err := p.replayInto(ctx, store, shadow, lo, hi, keep, batch)
	r.Events, r.Built, r.Partitions = n, built.low(), built.report()
	if err != nil {
		return fail(err)
	}
	var disabled []projection.ShardID
	enable := func() error {
		var errs []error
		for _, id := range disabled {
			if err := admin.Enable(context.WithoutCancel(ctx), id); err != nil {
				part := strings.TrimPrefix(id.Instance, projection.PartitionPrefix)
				errs = append(errs, fmt.Errorf("resume live indexing of partition %s (enable it with projector consumer enable %s --partition %s): %w",
					part, p.name, part, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, id := range ids {
		if err := admin.Disable(ctx, id); err != nil {
			return fail(errors.Join(fmt.Errorf("hold live indexing: %w", err), enable()))
		}
		disabled = append(disabled, id)
	}
	held, err := readCursors(ctx, store, admin, id)
	if err != nil {
		return fail(errors.Join(err, enable()))
	}
	if !sameLayout(built, held) {
		return fail(errors.Join(fmt.Errorf("%w: a split or merge ran while the reindex held the partitions; run it again: %w",
			projection.ErrLayoutChanged, projector.ErrInvalidTransition), enable()))
	}
	lo, hi, keep = p.between(built, held)
	n, err = p.replayInto(ctx, store, shadow, lo, hi, keep, batch)
	r.Events, r.Swapped, r.Partitions = r.Events+n, held.low(), held.report()
	if err != nil {
		return fail(errors.Join(err, enable()))
	}
	if err := sw.Swap(ctx, p.cfg.Index); err != nil {
		return fail(errors.Join(fmt.Errorf("swap: %w", err), enable()))
	}
	if err := enable(); err != nil {
		return r, fmt.Errorf("reindex %q: swapped, but %w", p.name, err)
	}
	return r, nil
}

// sameLayout reports whether two views have the same partitions.
func sameLayout(a, b cursors) bool {
	if len(a.parts) != len(b.parts) {
		return false
	}
	for i := range a.parts {
		if a.parts[i].seg != b.parts[i].seg {
			return false
		}
	}
	return true
}

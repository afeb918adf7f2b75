package search

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

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
// swaps; and enables every partition again. From before the disables to
// after the enables it holds the consumer's fence lock, so a split or merge
// waits for it; one that ran between the first read of the layout and the
// lock fails it with [projection.ErrLayoutChanged] (which matches
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
	// The layout is held from here to the enables: a split or merge takes
	// the consumer's fence lock, so one that came after the check below
	// would otherwise replace partitions the replay never held and leave
	// the enables naming rows that are gone (its children keep the
	// disabled status). The lock is held by a transaction that only ever
	// takes it, so it has no transaction id and holds back no consumer's
	// horizon (promise 3) across the Meilisearch calls; the fence comes
	// before the partitions' locks, which Disable and Enable take, as in a
	// split and a dispatcher's registration, so no one holds a partition's
	// lock while waiting for the fence here.
	fence, err := lockFence(ctx, store, p.name)
	if err != nil {
		return fail(err)
	}
	defer fence.release(ctx)
	// A split or merge that ran before the lock: refused before any
	// partition is disabled, rather than by a Disable of a partition gone.
	now, err := readCursors(ctx, store, admin, id)
	if err != nil {
		return fail(err)
	}
	if !sameLayout(built, now) {
		return fail(fmt.Errorf("%w: a split or merge ran while the reindex built the new index; run it again: %w",
			projection.ErrLayoutChanged, projector.ErrInvalidTransition))
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
	if err := fence.check(ctx); err != nil {
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

// fenceLock is the consumer's fence lock (its unpartitioned shard's, which
// every split, merge and partitioned registration takes) held by a
// transaction of its own that takes nothing else.
type fenceLock struct {
	tx       pgx.Tx
	store    *postgres.Store
	consumer string
}

// lockFence waits for consumer's fence lock: for a split or merge under
// way to finish, and keeps the next one waiting until release.
func lockFence(ctx context.Context, store *postgres.Store, consumer string) (fenceLock, error) {
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return fenceLock{}, fmt.Errorf("hold the partitions' layout: %w", err)
	}
	if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: consumer, Instance: projection.SharedInstance}); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fenceLock{}, fmt.Errorf("hold the partitions' layout: %w", err)
	}
	return fenceLock{tx: tx, store: store, consumer: consumer}, nil
}

// check fails if the lock's session is gone (killed, or ended by an
// idle-in-transaction timeout): the lock went with it, and a split or
// merge may have run since, so the reindex must not swap.
func (f fenceLock) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := f.tx.Exec(ctx, `SELECT 1`); err != nil {
		return fmt.Errorf("%w: the session holding the partitions' layout ended (%w); a split or merge may have run: run it again",
			projection.ErrLayoutChanged, err)
	}
	return nil
}

// release lets splits and merges, and an unpartitioned consumer's passes,
// run again (rolls the transaction back: it wrote nothing), and wakes the
// consumer's passes that found the lock taken rather than leave them to
// their next Recheck.
func (f fenceLock) release(ctx context.Context) {
	_ = f.tx.Rollback(context.WithoutCancel(ctx))
	_ = projection.WakeConsumer(ctx, f.store, f.consumer)
}

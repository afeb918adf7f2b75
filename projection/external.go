package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
)

// External is a projection's model outside PostgreSQL (a Meilisearch
// index), which a blue/green rebuild cannot copy and switch as it does
// tables: it builds a shadow of the target beside the live one instead, and
// swaps the two after the PostgreSQL switch committed. Declared here, where
// the dispatcher consumes it; search.Projection implements it for backends
// that can swap (stores/meilisearch).
//
// Every method must be idempotent: a crash may repeat any of them, and any
// dispatcher of the projection's version may be the one that repeats it.
type External interface {
	// Kind names the target ("meilisearch"). It is recorded with the
	// projection, so an ops binary without the code can request a rebuild
	// of a projection that declares no tables.
	Kind() string
	// PrepareShadow creates the empty shadow target of rebuild rebuildID
	// (dropping any a failed earlier attempt left), before the first
	// shadow pass. Handlers of a shadow pass write to it: they find the
	// rebuild with [ShadowRebuild].
	PrepareShadow(ctx context.Context, rebuildID int64) error
	// Swap makes the shadow of rebuildID the live target and deletes the
	// one it replaced. It runs after the rebuild's PostgreSQL switch
	// committed, perhaps more than once (a crash, another dispatcher), so
	// it must recognise a swap that already happened and never swap back.
	Swap(ctx context.Context, rebuildID int64) error
	// DropShadow deletes the shadow of rebuildID, if there is one: the
	// rebuild was cancelled.
	DropShadow(ctx context.Context, rebuildID int64) error
}

// ShadowRebuild reports the blue/green rebuild whose shadow pass a handler
// runs in, and false outside one (live passes, in-place replays). A
// handler that writes to an [External] target writes to that rebuild's
// shadow of it.
func ShadowRebuild(ctx context.Context) (int64, bool) {
	st, ok := ctx.Value(replayKey{}).(*replayState)
	if !ok || st.rebuildID == 0 {
		return 0, false
	}
	return st.rebuildID, true
}

// errSwapElsewhere: another partition of the consumer is swapping.
var errSwapElsewhere = errors.New("another partition is swapping the rebuilt target in")

// swapping finishes a rebuild of sh's projection that is 'swapping', in
// tx, which holds the live shard's lock: one process at a time swaps, and
// no live pass writes the target meanwhile (a live pass would write the
// old target, which the swap then replaces). It reports whether there was
// one; the caller commits tx.
func (d *Dispatcher) swapping(ctx context.Context, tx pgx.Tx, sh *shard) (bool, error) {
	ext := sh.proj.cfg.External
	var id int64
	err := tx.QueryRow(ctx, `SELECT id FROM `+d.store.Table("projector_rebuilds")+` WHERE name = $1 AND status = 'swapping'`,
		sh.id.Consumer).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read a swapping rebuild: %w", err)
	}
	if sh.balancer != nil {
		// A partition: the other partitions may find the rebuild swapping
		// at the same moment, and two swaps at once could swap the target
		// back. The one holding the unpartitioned row's lock swaps; the
		// others stand aside (writing nothing to the old target) until it
		// is recorded.
		var locked bool
		unpartitioned := ShardID{Consumer: sh.id.Consumer, Instance: SharedInstance}
		if err := tx.QueryRow(ctx, d.sql.tryLock, shardLockKey(d.store.Schema(), unpartitioned)).Scan(&locked); err != nil {
			return true, fmt.Errorf("lock the unpartitioned row for the swap: %w", err)
		}
		if !locked {
			return true, errSwapElsewhere
		}
	}
	if err := ext.Swap(ctx, id); err != nil {
		return true, fmt.Errorf("rebuild %d of %s: swap the new %s target in (the live shard stands aside until it succeeds): %w",
			id, sh.id.Consumer, ext.Kind(), err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+d.store.Table("projector_rebuilds")+` SET status = 'switched', finished_at = now()
		WHERE id = $1 AND status = 'swapping'`, id); err != nil {
		return true, fmt.Errorf("rebuild %d of %s: record the swap: %w", id, sh.id.Consumer, err)
	}
	d.logger.InfoContext(ctx, "projection dispatcher: rebuild swapped in; the new version is live",
		slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", id), slog.String("target", ext.Kind()))
	return true, nil
}

// finishSwap runs right after a switching pass committed a rebuild of an
// External projection as 'swapping': it takes the live shard's lock if it
// is free and swaps. When the lock is held, its holder is a live pass,
// which finds the rebuild swapping and finishes it itself; so does any
// dispatcher's next live pass if this one fails or its process dies.
func (d *Dispatcher) finishSwap(ctx context.Context, live *shard) {
	err := pgx.BeginFunc(ctx, d.store.Pool(), func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, d.sql.tryLock, shardLockKey(d.store.Schema(), ShardID{Consumer: live.id.Consumer, Instance: SharedInstance})).Scan(&locked); err != nil {
			return fmt.Errorf("lock the live shard: %w", err)
		}
		if !locked {
			return nil
		}
		_, err := d.swapping(ctx, tx, live)
		return err
	})
	if err != nil && ctx.Err() == nil {
		d.logger.WarnContext(ctx, "projection dispatcher: swap after a rebuild's switch failed; the live shard retries it",
			slog.String("consumer", live.id.Consumer), slog.Any("error", err))
	}
}

// dropCancelledShadow deletes the shadow target of a rebuild whose shadow
// shard ended, when the rebuild was cancelled (`projector rebuild cancel`
// runs where the projection's code may not be, and drops only what lives in
// PostgreSQL).
func (d *Dispatcher) dropCancelledShadow(ctx context.Context, sh *shard) {
	ext := sh.proj.cfg.External
	if ext == nil {
		return
	}
	var status string
	err := d.store.Pool().QueryRow(ctx, `SELECT status FROM `+d.store.Table("projector_rebuilds")+` WHERE id = $1`, sh.shadow.rebuildID).Scan(&status)
	if err == nil && status != "cancelled" {
		return
	}
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		err = ext.DropShadow(ctx, sh.shadow.rebuildID)
	}
	if err != nil && ctx.Err() == nil {
		d.logger.WarnContext(ctx, "projection dispatcher: dropping a cancelled rebuild's shadow target failed",
			slog.String("consumer", sh.id.Consumer), slog.Int64("rebuild", sh.shadow.rebuildID), slog.Any("error", err))
	}
}

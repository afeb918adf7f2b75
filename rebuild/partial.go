package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// PartialOptions tune a partial rebuild. The zero value is fine.
type PartialOptions struct {
	// BatchSize is how many events are read and applied at a time; default
	// the projection's BatchSize.
	BatchSize int
	// Logger receives handler panics and a line when the rebuild is done;
	// default slog.Default().
	Logger *slog.Logger
}

// PartialResult is what a partial rebuild did.
type PartialResult struct {
	Name  string
	Scope projection.Scope
	// Until is the live consumer's cursor: the scope was rebuilt with every
	// event of it up to here, exactly what the rest of the model holds.
	Until projector.Position
	// Events counts the scope's events replayed; DeadLettered those of
	// them a continuous-mode projection's handlers failed on.
	Events, DeadLettered int
	// ResolvedDeadLetters counts the consumer's open dead letters whose
	// events the replay applied: resolved with it, so a retry cannot apply
	// them a second time.
	ResolvedDeadLetters int
	// LockWait is how long the rebuild waited for a running batch of the
	// live consumer; Held how long it then held the consumer still (and
	// its transaction open) while it cleared and replayed the scope.
	LockWait, Held time.Duration
	// Partitions are, for a partitioned consumer, the partitions the
	// scope touched (a stream's one, a tenant's every one) and each one's
	// cursor: its streams were rebuilt up to it, and Until is the latest
	// of them. LeftToLive counts the scope's events after their own
	// partition's cursor (but not after Until): not replayed, the live
	// partition applies them after the rebuild, as it would have.
	Partitions []PartitionCursor
	LeftToLive int
}

// Partial rebuilds what one tenant or one stream contributed to p's live
// model, and nothing else, for the "one customer's read model is wrong"
// case. It needs the projection's code (it runs the handlers here), so it
// runs in-process, in one transaction:
//
//  1. it waits for the live shard's advisory lock, so the live consumer
//     stands still until the end (its passes skip the shard meanwhile);
//  2. it reads the consumer's cursor and refuses a consumer of another
//     version than p (a rolling deploy's other binary);
//  3. it clears the scope as p declares (AsyncConfig.ScopeColumns, then
//     ResetScope), scoped to the scope's tenant;
//  4. it replays the scope's events up to the cursor, read through the
//     events' stream index (not the whole log), with handlers told they are
//     replaying (side effects skipped, nothing emitted again);
//  5. it checks, under a lock a prune waits for, that retention deleted
//     no event of p's types meanwhile ([ErrPruned]: the replay may have
//     missed them);
//  6. it commits: the scope is rebuilt exactly to where the rest of the
//     model is, and the live consumer goes on from its cursor.
//
// The transaction holds the consumer still and, once it has written, holds
// back every consumer's horizon until it commits: PartialResult.Held says
// for how long (docs/rebuilds.md has measured figures). A failure of any
// step rolls everything back; the model is as it was.
//
// A partitioned consumer (AsyncConfig.Partitions) is rebuilt the same way
// with one difference: each stream has its own partition's cursor, so step
// 1 waits, after the consumer's fence lock (which keeps splits and merges
// out), for the lock of every partition the scope touches — a stream's
// one, a tenant's all — and step 4 replays each stream up to its own
// partition's cursor (partial_partition.go). A consumer partitioned by key
// (a saga) is refused.
func Partial(ctx context.Context, store *postgres.Store, p *projection.Async, scope projection.Scope, opts PartialOptions) (PartialResult, error) {
	res := PartialResult{Name: p.Name(), Scope: scope}
	cfg := p.Config()
	if opts.BatchSize < 0 || opts.BatchSize > 100_000 {
		return res, fmt.Errorf("%w: batch size %d outside 1..100000", ErrNotRebuildable, opts.BatchSize)
	}
	batch := opts.BatchSize
	if batch == 0 {
		batch = cfg.BatchSize
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if err := scope.Validate(); err != nil {
		return res, fmt.Errorf("partial rebuild of %s: %w", p.Name(), err)
	}
	if err := p.Validate(store.Registry()); err != nil {
		return res, fmt.Errorf("partial rebuild of %s: %w", p.Name(), err)
	}
	if cfg.Delivery != projection.Shared {
		return res, fmt.Errorf("%w: %s is a per-instance consumer: its state lives in each process, not in tables", ErrNotRebuildable, p.Name())
	}
	if err := p.CheckScope(scope); err != nil {
		return res, fmt.Errorf("%w: %w", ErrNotRebuildable, err)
	}
	if cfg.PartitionKey != nil {
		return res, fmt.Errorf("%w: %s is partitioned by key (AsyncConfig.PartitionKey, as sagas are), not by stream: its partitions cannot be told from a scope's streams", ErrNotRebuildable, p.Name())
	}
	// A handler that loses a conflict (a deadlock's victim, a serialization
	// failure) rolls the whole transaction back with nothing recorded; it
	// is tried again from the start, a few times, before the error is the
	// caller's.
	err := pgretry.Do(ctx, "partial rebuild of "+p.Name(), pgretry.Conflict, func() error {
		res = PartialResult{Name: p.Name(), Scope: scope}
		return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error { return partialTx(ctx, tx, store, p, scope, batch, logger, &res) })
	})
	// The consumer's locks are free again: its passes that found them
	// taken look now rather than at their dispatcher's next Recheck.
	_ = projection.WakeConsumer(ctx, store, p.Name())
	if err != nil {
		return res, err
	}
	logger.InfoContext(ctx, "rebuild: partial rebuild done", slog.String("consumer", p.Name()), slog.String("scope", scope.String()),
		slog.String("until", res.Until.String()), slog.Int("partitions", len(res.Partitions)), slog.Int("events", res.Events),
		slog.Int("dead_lettered", res.DeadLettered), slog.Duration("held", res.Held))
	return res, nil
}

// partialTx is one try of Partial's transaction, steps 1 to 5, in tx.
func partialTx(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *projection.Async, scope projection.Scope, batch int,
	logger *slog.Logger, res *PartialResult) error {
	if err := checkPruned(ctx, tx, store, p.Name(), p.EventTypes()); err != nil {
		return err
	}
	started := time.Now()
	if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: p.Name()}); err != nil {
		return err
	}
	locked := time.Now()
	res.LockWait = locked.Sub(started)
	var version int
	err := tx.QueryRow(ctx, `SELECT cursor_tx_id, cursor_seq, version FROM `+store.Table("projector_consumers")+`
		WHERE name = $1 AND instance_id = $2`, p.Name(), projection.SharedInstance).Scan(&res.Until.TxID, &res.Until.Seq, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: projection %s has no consumer yet; a dispatcher builds it from the start when it first runs", ErrNotRebuildable, p.Name())
	}
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: read its consumer: %w", p.Name(), err)
	}
	if version == projection.PartitionedVersion {
		// Each stream of the scope replays up to its own
		// partition's cursor, under that partition's lock.
		res.Until = projector.Position{}
		if err := partialPartitioned(ctx, tx, store, p, scope, batch, logger, res); err != nil {
			return err
		}
	} else if err := partialShard(ctx, tx, store, p, scope, batch, logger, version, res); err != nil {
		return err
	}
	// A prune that committed while this waited for the lock or replayed
	// may have deleted events of the scope the replay then missed.
	if err := recheckPruned(ctx, tx, store, p.Name(), p.EventTypes()); err != nil {
		return err
	}
	res.Held = time.Since(locked)
	return nil
}

// partialShard is Partial's steps 2 to 4 for an unpartitioned consumer,
// whose cursor res.Until holds, in tx, which holds its shard lock.
func partialShard(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *projection.Async, scope projection.Scope, batch int,
	logger *slog.Logger, version int, res *PartialResult) error {
	cfg := p.Config()
	if version != cfg.Version {
		return fmt.Errorf("%w: the live model of %s is version %d and this binary's projection is version %d: run the partial rebuild with the binary of the live version",
			ErrNotRebuildable, p.Name(), version, cfg.Version)
	}
	if err := projection.ClearScopeTx(ctx, tx, store, p, scope); err != nil {
		if errors.Is(err, projection.ErrScopeUnsupported) {
			return fmt.Errorf("%w: %w", ErrNotRebuildable, err)
		}
		return err
	}
	cur, err := store.OpenScopeTx(ctx, tx, postgres.ScopeQuery{Tenant: scope.Tenant, StreamType: scope.StreamType, StreamID: scope.StreamID,
		EventTypes: p.EventTypes(), Until: res.Until, Raw: true})
	if err != nil {
		return fmt.Errorf("partial rebuild of %s: %w", p.Name(), err)
	}
	for {
		events, err := cur.Next(ctx, batch)
		if err != nil {
			return fmt.Errorf("partial rebuild of %s: %w", p.Name(), err)
		}
		if len(events) == 0 {
			break
		}
		r, err := projection.ReplayTx(ctx, tx, store, p, events, logger)
		res.Events += r.Applied + r.DeadLettered
		res.DeadLettered += r.DeadLettered
		res.ResolvedDeadLetters += r.Resolved
		if err != nil {
			return fmt.Errorf("partial rebuild of %s, %s: %w", p.Name(), scope, err)
		}
	}
	if err := cur.Close(ctx); err != nil {
		return fmt.Errorf("partial rebuild of %s: %w", p.Name(), err)
	}
	return nil
}

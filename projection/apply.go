package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ReplayResult is what [ReplayTx] did.
type ReplayResult struct {
	// Applied counts the events whose handlers ran and committed with tx.
	Applied int
	// DeadLettered counts the events whose handlers failed in continuous
	// mode ([SkipApplyErrors]): their effects were rolled back, and each is
	// in the dead-letter table (recorded again only if the live consumer
	// had not recorded it already).
	DeadLettered int
	// Held counts the events left out because an open park holds them
	// ([ParkStream]): a retry of the park applies them.
	Held int
	// Resolved counts the open dead letters of the live model whose events
	// the replay applied: they are marked resolved in tx, so no retry
	// applies those events a second time.
	Resolved int
}

// ReplayError is a handler failure that ended a replay of a halt-on-error
// projection: nothing of the replay should commit, and Event is the event
// whose handler failed.
type ReplayError struct {
	Event projector.Event
	Err   error
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("replay: %s v%d of %s (%s) failed: %v", e.Event.Type, e.Event.Version, e.Event.Stream, e.Event.ID, e.Err)
}

func (e *ReplayError) Unwrap() error { return e.Err }

// ReplayTx applies p's handlers to events, in the order given (log order),
// inside the caller's transaction tx, the way a dispatcher pass applies a
// batch: payloads decoded, each event's handler scoped to its tenant,
// queued writes flushed, a failing event's effects rolled back to a
// savepoint, handlers under the projection's BatchTimeout. Every event is
// treated as a replay — the live version handled it already — so
// [Replaying] is true, [SkipOnReplay] handlers do not run and [Emit]
// appends nothing. It moves no cursor and calls no AfterCommit: it is the
// building block of a partial rebuild (package rebuild), whose caller holds
// the consumer's shard lock and commits.
//
// A failing event follows the projection's error mode: halt-on-error and
// park-stream return a [*ReplayError] (the caller rolls back); continuous mode
// dead-letters it, unless the live consumer did already, and goes on. A
// systemic failure ([IsSystemic]) returns a [*ReplayError] in either mode. tx
// ends scoped to the system tenant. logger receives the panics of handlers;
// nil means slog.Default().
func ReplayTx(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, events []projector.Event, logger *slog.Logger) (ReplayResult, error) {
	return ReplayShardTx(ctx, tx, store, p, SharedInstance, events, logger)
}

// ReplayShardTx is [ReplayTx] for one shard of p, named by its instance
// id: a partition of a partitioned consumer ([PartitionInstance]) keeps its
// dead letters under its own id, so the dead letters looked up, recorded
// and resolved are that shard's. Every event must belong to that shard (a
// partition's streams); the caller holds its lock.
func ReplayShardTx(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, instance string, events []projector.Event, logger *slog.Logger) (ReplayResult, error) {
	var res ReplayResult
	if err := p.Validate(store.Registry()); err != nil {
		return res, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	d := &Dispatcher{store: store, logger: logger, sql: buildDispatchSQL(store)}
	sh := &shard{id: ShardID{Consumer: p.name, Instance: instance}, proj: p}
	handlerCtx, cancel := context.WithTimeout(ctx, p.cfg.BatchTimeout)
	defer cancel()
	// The scope is unknown: the caller's transaction may be scoped to any
	// tenant, so the first event scopes it.
	if p.cfg.ErrorMode == ParkStream {
		// Events an open park holds are left to it: a retry applies them,
		// after the ones replayed here, and must not apply them twice.
		var err error
		if events, res.Held, err = withoutParked(ctx, tx, store, p.name, events); err != nil {
			return res, err
		}
	}
	r := newRun(d, tx, sh, "", handlerCtx)
	r.handlerCtx = withReplay(r.handlerCtx, &replayState{})
	rest := events
	var applied [][16]byte
	for len(rest) > 0 {
		k, herr := r.applyUntil(ctx, rest, 0)
		if r.abort != nil {
			return res, r.abort
		}
		if r.timedOut && errors.Is(handlerCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return res, fmt.Errorf("replay of %s: batch timeout (%v) exceeded: %w", p.name, p.cfg.BatchTimeout, herr)
		}
		n := k
		if k < 0 {
			n = len(rest)
		}
		for _, ev := range rest[:n] {
			applied = append(applied, [16]byte(ev.ID))
		}
		if k < 0 {
			res.Applied += len(rest)
			break
		}
		res.Applied += k
		failing := rest[k]
		if err := r.unscope(ctx); err != nil {
			return res, err
		}
		if handlerLostConflict(herr) {
			// Not the event's failure: the caller rolls back and may run
			// the replay again (conflictError).
			return res, &conflictError{event: failing, err: herr}
		}
		if p.cfg.ErrorMode != SkipApplyErrors || ctx.Err() != nil || IsSystemic(herr) {
			// A systemic failure would dead-letter every event after it.
			// ParkStream halts too: a replay has no park of its own.
			return res, &ReplayError{Event: failing, Err: herr}
		}
		if err := d.deadLetterOnce(ctx, tx, sh, failing, herr); err != nil {
			return res, err
		}
		res.DeadLettered++
		rest = rest[k+1:]
	}
	if err := r.unscope(ctx); err != nil {
		return res, err
	}
	// An open dead letter of the live model whose event this replay has
	// just applied is resolved with it: a retry later would apply it twice.
	if len(applied) > 0 {
		tag, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_dead_letters")+` SET status = 'resolved', resolved_at = now(),
				retry_requested_at = NULL
			WHERE consumer = $1 AND instance_id = $2 AND status = 'open' AND event_id = ANY($3) AND model_rebuild_id = `+liveModel(store, "$1"),
			p.name, instance, applied)
		if err != nil {
			return res, fmt.Errorf("replay: resolve the dead letters of applied events: %w", err)
		}
		res.Resolved = int(tag.RowsAffected())
	}
	return res, nil
}

// deadLetterOnce records a replayed event that failed in continuous mode,
// unless the consumer recorded it already when it failed live.
func (d *Dispatcher) deadLetterOnce(ctx context.Context, tx pgx.Tx, sh *shard, failing projector.Event, herr error) error {
	var seen bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+d.store.Table("projector_dead_letters")+`
		WHERE consumer = $1 AND instance_id = $2 AND event_id = $3)`, sh.id.Consumer, sh.id.Instance, [16]byte(failing.ID)).Scan(&seen); err != nil {
		return fmt.Errorf("replay: look up dead letter: %w", err)
	}
	if seen {
		return nil
	}
	herr = RedactError(herr, OpenedEvents(d.store.Registry(), failing)...) // stored and logged (errortext.go)
	if _, err := tx.Exec(ctx, d.sql.deadLetter, sh.id.Consumer, sh.id.Instance, [16]byte(failing.ID), failing.Position.TxID,
		failing.Position.Seq, failing.Type, failing.Stream.Tenant, failing.Stream.Type, failing.Stream.ID, failing.Version,
		"replay: "+StoredError(herr)); err != nil {
		return fmt.Errorf("replay: write dead letter: %w", err)
	}
	d.logger.WarnContext(ctx, "projection replay: event dead-lettered (continuous mode)",
		slog.String("consumer", sh.id.String()), slog.String("event_id", failing.ID.String()),
		slog.String("type", failing.Type), slog.Any("error", herr))
	return nil
}

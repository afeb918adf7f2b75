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

// ApplyError is a handler failure that ended an [ApplyTx]: Event is the
// event whose handler (or queued write, or payload decoding) failed.
type ApplyError struct {
	Event projector.Event
	Err   error
}

func (e *ApplyError) Error() string {
	return fmt.Sprintf("apply: %s v%d of %s (%s) failed: %v", e.Event.Type, e.Event.Version, e.Event.Stream, e.Event.ID, e.Err)
}

func (e *ApplyError) Unwrap() error { return e.Err }

// ApplyTx applies p's handlers to events, in the order given, inside the
// caller's transaction tx, exactly as a live dispatcher pass applies one
// batch: the same code decodes payloads (upcasters included), scopes each
// event's handler to its tenant, streams [Queue]d writes, groups a batch
// handler's events by tenant and stream, and runs handlers under the
// projection's BatchTimeout. [Replaying] is false and [Emit] appends, as
// live. It moves no cursor, writes no dead letter and calls no AfterCommit.
//
// It exists for tests (package projectiontest), which apply events to a
// projection inside a transaction they roll back, so a spec that passes
// there runs the production apply path. The first event that fails ends the
// call with an [*ApplyError], whatever the projection's error mode: the
// effects of the events before it are in tx, its own are rolled back to a
// savepoint. tx ends scoped to the system tenant. logger receives the
// panics of handlers; nil means slog.Default().
func ApplyTx(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, events []projector.Event, logger *slog.Logger) error {
	if err := p.Validate(store.Registry()); err != nil {
		return err
	}
	if logger == nil {
		logger = slog.Default()
	}
	d := &Dispatcher{store: store, logger: logger, sql: buildDispatchSQL(store)}
	sh := &shard{id: ShardID{Consumer: p.name, Instance: SharedInstance}, proj: p}
	handlerCtx, cancel := context.WithTimeout(ctx, p.cfg.BatchTimeout)
	defer cancel()
	// The caller's transaction may be scoped to any tenant: the first
	// event scopes it.
	r := newRun(d, tx, sh, "", handlerCtx)
	k, herr := r.applyUntil(ctx, events, 0)
	if r.abort != nil {
		return r.abort
	}
	if r.timedOut && errors.Is(handlerCtx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("apply to %s: batch timeout (%v) exceeded: %w", p.name, p.cfg.BatchTimeout, herr)
	}
	if err := r.unscope(ctx); err != nil {
		return err
	}
	if k >= 0 {
		return &ApplyError{Event: events[k], Err: herr}
	}
	return nil
}

package jetstream

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// handle runs the consumer's handler on ev in tx, turning a panic into an
// error, as the projection dispatcher does: a handler that panics fails
// its event like one that returns an error — counted, retried, dead-
// lettered or parked, and on a retry the dead letter or park kept with the
// error recorded — instead of taking the consumer's process down with the
// transaction still open. The panic and its stack are logged at ERROR.
func (c *Consumer) handle(ctx context.Context, tx pgx.Tx, ev projector.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic in handler: %v", p)
			c.logger.ErrorContext(ctx, "jetstream consumer: handler panicked", slog.String("subscription", c.cfg.Subscription),
				slog.String("event_id", ev.ID.String()), slog.String("type", ev.Type), slog.Any("panic", p),
				slog.String("stack", string(debug.Stack())))
		}
	}()
	return c.cfg.Handler(ctx, tx, ev)
}

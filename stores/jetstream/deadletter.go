package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// DeadLetter is a message the claims consumer gave up on.
type DeadLetter struct {
	ID           int64
	Subscription string
	// EventID is uuid.Nil for a message that could not be decoded.
	EventID    uuid.UUID
	Subject    string
	Header     nats.Header
	Data       []byte
	Error      string
	Deliveries int64
	CreatedAt  time.Time
}

// ListDeadLetters returns a subscription's dead letters, oldest first, at
// most limit (1..10000).
func ListDeadLetters(ctx context.Context, store *postgres.Store, subscription string, limit int) ([]DeadLetter, error) {
	if limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("%w: limit %d outside 1..10000", ErrInvalidConfig, limit)
	}
	rows, err := store.Pool().Query(ctx, `SELECT id, subscription, coalesce(event_id, '00000000-0000-0000-0000-000000000000'), subject, headers, data, error, deliveries, created_at
		FROM `+store.Table("projector_jetstream_dead_letters")+` WHERE subscription = $1 ORDER BY id LIMIT $2`, subscription, limit)
	if err != nil {
		return nil, fmt.Errorf("list jetstream dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list jetstream dead letters: %w", err)
	}
	return out, nil
}

func scanDeadLetter(r pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := r.Scan(&d.ID, &d.Subscription, &d.EventID, &d.Subject, &d.Header, &d.Data, &d.Error, &d.Deliveries, &d.CreatedAt)
	return d, err
}

// RetryDeadLetter runs the handler again for the dead letter id of this
// consumer's subscription, in one transaction that deletes the dead letter:
// on success the event's effects and the removal commit together; on
// failure nothing changes and the error is returned. The event's claim and
// stream version were recorded when it was dead-lettered, so the retried
// effect lands after its stream's later events. A missing id is
// projector.ErrNotFound.
func (c *Consumer) RetryDeadLetter(ctx context.Context, id int64) error {
	return pgx.BeginFunc(ctx, c.cfg.Store.Pool(), func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, subscription, coalesce(event_id, '00000000-0000-0000-0000-000000000000'), subject, headers, data, error, deliveries, created_at
			FROM `+c.cfg.Store.Table("projector_jetstream_dead_letters")+` WHERE id = $1 AND subscription = $2 FOR UPDATE`, id, c.cfg.Subscription)
		if err != nil {
			return fmt.Errorf("retry dead letter %d: %w", id, err)
		}
		d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("retry dead letter %d of %s: %w", id, c.cfg.Subscription, projector.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("retry dead letter %d: %w", id, err)
		}
		ev, err := Decode(c.cfg.Store.Registry(), d.Header, d.Data)
		if err != nil {
			return fmt.Errorf("retry dead letter %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+c.cfg.Store.Table("projector_jetstream_dead_letters")+` WHERE id = $1`, id); err != nil {
			return fmt.Errorf("retry dead letter %d: %w", id, err)
		}
		if err := c.cfg.Store.ScopeTx(ctx, tx, ev.Stream.Tenant); err != nil {
			return err
		}
		if err := c.cfg.Handler(ctx, tx, ev); err != nil {
			return fmt.Errorf("retry dead letter %d: event %s (%s): %w", id, ev.ID, ev.Type, err)
		}
		return nil
	})
}

// GetDeadLetter returns the dead letter id of subscription;
// projector.ErrNotFound when there is none.
func GetDeadLetter(ctx context.Context, store *postgres.Store, subscription string, id int64) (DeadLetter, error) {
	rows, err := store.Pool().Query(ctx, `SELECT id, subscription, coalesce(event_id, '00000000-0000-0000-0000-000000000000'), subject, headers, data, error, deliveries, created_at
		FROM `+store.Table("projector_jetstream_dead_letters")+` WHERE id = $1 AND subscription = $2`, id, subscription)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("jetstream dead letter %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("jetstream dead letter %d of %s: %w", id, subscription, projector.ErrNotFound)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("jetstream dead letter %d: %w", id, err)
	}
	return d, nil
}

// DiscardDeadLetter deletes the dead letter id of subscription without
// running its handler: the operator's decision that its effects are not
// wanted. The event stays claimed and its stream past it, so it is never
// applied later either. It waits for a retry of the same dead letter in
// progress and then finds nothing (projector.ErrNotFound), so an event is
// either retried or discarded, never both.
func DiscardDeadLetter(ctx context.Context, store *postgres.Store, subscription string, id int64) error {
	tag, err := store.Pool().Exec(ctx, `DELETE FROM `+store.Table("projector_jetstream_dead_letters")+` WHERE id = $1 AND subscription = $2`, id, subscription)
	if err != nil {
		return fmt.Errorf("discard jetstream dead letter %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("discard jetstream dead letter %d of %s: %w", id, subscription, projector.ErrNotFound)
	}
	return nil
}

package jetstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrDeadLetterNotOpen: a retry or a discard of a dead letter that is not
// open any more: a retry applied it (resolved) or an operator discarded it.
// Both keep the row as the record, and neither may happen twice, nor one
// after the other: a discarded event must never be applied, and a resolved
// one never again. It matches [projector.ErrInvalidTransition] too, so the
// CLI reports it as a refusal, as it does for the dispatcher's dead letters.
var ErrDeadLetterNotOpen = fmt.Errorf("%w: the dead letter is not open", projector.ErrInvalidTransition)

// DeadLetter is a message the claims consumer gave up on, and what has been
// done about it since. Its Status is one of the dispatcher's dead-letter
// statuses ([projection.DeadLetterOpen], [projection.DeadLetterResolved],
// [projection.DeadLetterDiscarded]), which mean the same here.
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
	// Status is open until a retry applies the message (resolved) or an
	// operator discards it (discarded).
	Status string
	// ResolvedAt is when it was resolved or discarded; nil while open.
	ResolvedAt *time.Time
	// LastRetriedAt is when a retry last ran, whether it succeeded or not.
	LastRetriedAt *time.Time
}

const deadLetterColumns = `id, subscription, coalesce(event_id, '00000000-0000-0000-0000-000000000000'), subject, headers, data, error, deliveries, created_at,
	status, resolved_at, last_retried_at`

func scanDeadLetter(r pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := r.Scan(&d.ID, &d.Subscription, &d.EventID, &d.Subject, &d.Header, &d.Data, &d.Error, &d.Deliveries, &d.CreatedAt,
		&d.Status, &d.ResolvedAt, &d.LastRetriedAt)
	return d, err
}

// ListDeadLetters returns a subscription's open dead letters, the ones that
// need an operator, oldest first, at most limit (1..10000); a bad
// subscription name or limit matches [ErrInvalidConfig].
// [ListDeadLettersMatching] lists the resolved and discarded ones too, and
// pages.
func ListDeadLetters(ctx context.Context, store *postgres.Store, subscription string, limit int) ([]DeadLetter, error) {
	if limit < 1 || limit > 10_000 {
		return nil, fmt.Errorf("%w: limit %d outside 1..10000", ErrInvalidConfig, limit)
	}
	return ListDeadLettersMatching(ctx, store, DeadLetterFilter{Subscription: subscription, Status: projection.DeadLetterOpen, Limit: limit})
}

// DeadLetterFilter selects a subscription's dead letters for
// [ListDeadLettersMatching], as [projection.DeadLetterFilter] does the
// dispatcher's: since dead letters are kept after a retry or a discard, a
// subscription's record outgrows one page, and AfterID reaches the rest.
type DeadLetterFilter struct {
	// Subscription is required ([ValidateSubscription]).
	Subscription string
	// Status is "open", "resolved", "discarded", or "" for all.
	Status string
	// AfterID pages: only dead letters with a larger id (pass the last id
	// of the previous page); 0 starts at the oldest.
	AfterID int64
	// Limit caps the rows returned, 1..10000; 0 means 100.
	Limit int
}

// validDeadLetterStatus is ListDeadLettersMatching's status check: the
// dispatcher's, whose sentinel the error matches too.
func validDeadLetterStatus(status string) error {
	if err := projection.ValidateDeadLetterStatus(status); err != nil {
		return fmt.Errorf("%w: list jetstream dead letters: %w", ErrInvalidConfig, err)
	}
	return nil
}

// validateListing checks what a listing of a subscription's parks or dead
// letters is given, in this order: the subscription (its error prefixed
// with list, what the listing is), the page (limit 0..10000, 0 for 100; an
// after id not negative) and the status, which valid checks, since parks
// and dead letters have statuses of their own. Each error matches
// [ErrInvalidConfig].
func validateListing(list, subscription string, limit int, afterID int64, status string, valid func(string) error) error {
	if err := ValidateSubscription(subscription); err != nil {
		return fmt.Errorf("%s: %w", list, err)
	}
	if limit < 0 || limit > 10_000 {
		return fmt.Errorf("%w: limit %d outside 1..10000 (0 for 100)", ErrInvalidConfig, limit)
	}
	if afterID < 0 {
		return fmt.Errorf("%w: after id %d is negative (0 starts at the oldest)", ErrInvalidConfig, afterID)
	}
	return valid(status)
}

// ListDeadLettersMatching returns the dead letters f selects, oldest (lowest
// id) first, at most f.Limit. A bad subscription, status, limit or a
// negative AfterID matches [ErrInvalidConfig], and nothing is read; a bad
// status matches [projection.ErrInvalidFilter] too.
func ListDeadLettersMatching(ctx context.Context, store *postgres.Store, f DeadLetterFilter) ([]DeadLetter, error) {
	if err := validateListing("list jetstream dead letters", f.Subscription, f.Limit, f.AfterID, f.Status, validDeadLetterStatus); err != nil {
		return nil, err
	}
	limit := cmp.Or(f.Limit, 100)
	rows, err := store.Pool().Query(ctx, `SELECT `+deadLetterColumns+` FROM `+store.Table("projector_jetstream_dead_letters")+`
		WHERE subscription = $1 AND ($2 = '' OR status = $2) AND id > $3 ORDER BY id LIMIT $4`, f.Subscription, f.Status, f.AfterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list jetstream dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list jetstream dead letters: %w", err)
	}
	return out, nil
}

// OpenDeadLetters is how many open dead letters one subscription has in
// one schema.
type OpenDeadLetters struct {
	Schema       string `json:"schema"`
	Subscription string `json:"subscription"`
	Open         int64  `json:"open"`
}

// CountOpenDeadLetters returns, per subscription with any, how many open
// dead letters the claims consumers of store's schema have, by
// subscription name, so an operator sees that some wait for a retry or a
// discard. It counts on the partial index of the open ones. Subscriptions
// without open dead letters are not listed; an empty result is an empty
// slice.
func CountOpenDeadLetters(ctx context.Context, store *postgres.Store) ([]OpenDeadLetters, error) {
	rows, err := store.Pool().Query(ctx, `SELECT $1::text, subscription, count(*) FROM `+store.Table("projector_jetstream_dead_letters")+`
		WHERE status = 'open' GROUP BY subscription ORDER BY subscription`, store.Schema())
	if err != nil {
		return nil, fmt.Errorf("count open jetstream dead letters: %w", err)
	}
	return collectOpen(rows)
}

// CountOpenDeadLettersInDatabase is [CountOpenDeadLetters] for every
// schema of store's database that holds claims-consumer tables this role
// may read, by schema and subscription: what `projector relay status`
// shows, since a consumer often keeps its tables in a schema of its own
// beside the relaying application's. Schemas the role cannot read are
// left out.
func CountOpenDeadLettersInDatabase(ctx context.Context, store *postgres.Store) ([]OpenDeadLetters, error) {
	// The tables of migration 0013 or later (with a status).
	return countInDatabase[OpenDeadLetters](ctx, store, "count open jetstream dead letters", "projector_jetstream_dead_letters", "open")
}

func collectOpen(rows pgx.Rows) ([]OpenDeadLetters, error) {
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[OpenDeadLetters])
	if err != nil {
		return nil, fmt.Errorf("count open jetstream dead letters: %w", err)
	}
	if out == nil {
		out = []OpenDeadLetters{}
	}
	return out, nil
}

// RetryDeadLetter runs the handler again for the open dead letter id of
// this consumer's subscription, in one transaction that marks it resolved:
// on success the event's effects and the resolved status commit together.
// On failure the handler's writes roll back, the dead letter stays open
// with the new error and the time of the retry, and a [*RetryFailedError]
// is returned.
// The event's claim and stream version were recorded when it was
// dead-lettered, so the retried effect lands after its stream's later
// events. A missing id is projector.ErrNotFound; one that is resolved or
// discarded already is [ErrDeadLetterNotOpen]. The row is locked for the
// transaction, so a concurrent retry or [DiscardDeadLetter] of the same
// dead letter waits and then finds it no longer open: an event is applied
// once or discarded, never both. A retry aborted by a conflict with
// another transaction (a deadlock or serialization failure, in the handler
// or not) or by its lost connection says nothing about the event: it is
// tried again, up to five times, and then returned as an error with
// nothing recorded; a handler failure that is not about the event
// ([projection.IsSystemic]: a missing table or grant) is returned at once
// with nothing recorded either.
func (c *Consumer) RetryDeadLetter(ctx context.Context, id int64) error {
	table := c.cfg.Store.Table("projector_jetstream_dead_letters")
	var herr error
	var ev projector.Event
	err := pgretry.Do(ctx, fmt.Sprintf("retry dead letter %d of %s", id, c.cfg.Subscription), pgretry.Retryable, func() error {
		return pgx.BeginFunc(ctx, c.cfg.Store.Pool(), func(tx pgx.Tx) error {
			var err error
			ev, herr, err = c.retryDeadLetterTx(ctx, tx, table, id)
			return err
		})
	})
	if err != nil {
		return err
	}
	if herr != nil {
		c.logger.WarnContext(ctx, "jetstream consumer: dead letter retried, failed again", "subscription", c.cfg.Subscription, "id", id, "err", herr)
		return &RetryFailedError{ID: id, Subscription: c.cfg.Subscription, EventID: ev.ID, Type: ev.Type, Err: herr}
	}
	c.logger.InfoContext(ctx, "jetstream consumer: dead letter retried and resolved", "subscription", c.cfg.Subscription, "id", id)
	c.refreshMetrics(ctx)
	return nil
}

// retryDeadLetterTx is one try of [Consumer.RetryDeadLetter] in tx: it
// returns the event and the handler's failure, recorded on the dead
// letter, unless pgretry.Retryable takes it: then it is tx's error (err),
// and the whole transaction goes.
func (c *Consumer) retryDeadLetterTx(ctx context.Context, tx pgx.Tx, table string, id int64) (ev projector.Event, herr, err error) {
	rows, err := tx.Query(ctx, `SELECT `+deadLetterColumns+` FROM `+table+` WHERE id = $1 AND subscription = $2 FOR UPDATE`, id, c.cfg.Subscription)
	if err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return ev, nil, fmt.Errorf("retry dead letter %d of %s: %w", id, c.cfg.Subscription, projector.ErrNotFound)
	}
	if err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, err)
	}
	if d.Status != projection.DeadLetterOpen {
		return ev, nil, fmt.Errorf("retry dead letter %d of %s: it is %s already (nothing applied again): %w", id, c.cfg.Subscription, d.Status, ErrDeadLetterNotOpen)
	}
	if ev, err = Decode(c.cfg.Store.Registry(), d.Header, d.Data); err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, err)
	}
	// The handler runs in a savepoint, so that its failure (an SQL
	// error aborts the transaction) rolls back its writes, the resolved
	// status and the tenant scope, and leaves the transaction to record
	// the failed retry. The status is written before the scope, which
	// only ever narrows privileges: a tenant role needs no grant on
	// this table.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, err)
	}
	if _, err := sp.Exec(ctx, `UPDATE `+table+` SET status = 'resolved', resolved_at = now(), last_retried_at = now() WHERE id = $1`, id); err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: mark it resolved: %w", id, err)
	}
	if err := c.cfg.Store.ScopeTx(ctx, sp, ev.Stream.Tenant); err != nil {
		return ev, nil, err
	}
	if herr = c.handle(ctx, sp, ev); herr == nil {
		if err := sp.Commit(ctx); err != nil {
			return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, err)
		}
		return ev, nil, nil
	}
	if pgretry.Retryable(herr) {
		return ev, nil, fmt.Errorf("retry dead letter %d: %w", id, herr) // the whole transaction goes
	}
	if projection.IsSystemic(herr) {
		// Not about the event (a missing table or grant): the whole
		// transaction goes too, and the caller sees why.
		return ev, nil, fmt.Errorf("retry dead letter %d: the handler failed for a reason not about the event (nothing recorded): %w", id, herr)
	}
	if err := sp.Rollback(ctx); err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: roll back the failed handler: %w", id, err)
	}
	// Recorded and returned without the personal values of ev the handler
	// may quote (projection.StoredError).
	herr = projection.RedactError(herr, projection.OpenedEvents(c.cfg.Store.Registry(), ev)...)
	if _, err := tx.Exec(ctx, `UPDATE `+table+` SET error = $2, last_retried_at = now() WHERE id = $1`, id, "retry: "+projection.StoredError(herr)); err != nil {
		return ev, nil, fmt.Errorf("retry dead letter %d: record the failed retry: %w", id, err)
	}
	return ev, herr, nil
}

// RetryFailedError is [Consumer.RetryDeadLetter]'s error when the retry ran
// and the handler failed again: its writes rolled back, the dead letter
// stays open with Err as its error and the retry's time. Err is the
// handler's error (errors.Is and errors.As reach it).
type RetryFailedError struct {
	ID           int64
	Subscription string
	EventID      uuid.UUID
	Type         string
	Err          error
}

func (e *RetryFailedError) Error() string {
	return fmt.Sprintf("retry dead letter %d of %s: event %s (%s): the handler failed again, the dead letter stays open: %v",
		e.ID, e.Subscription, e.EventID, e.Type, e.Err)
}

func (e *RetryFailedError) Unwrap() error { return e.Err }

// DiscardDeadLetter is [DiscardDeadLetter] for this consumer's
// subscription; with a Registerer the open dead-letter gauge drops at once
// rather than at the next periodic count.
func (c *Consumer) DiscardDeadLetter(ctx context.Context, id int64) error {
	if err := DiscardDeadLetter(ctx, c.cfg.Store, c.cfg.Subscription, id); err != nil {
		return err
	}
	c.refreshMetrics(ctx)
	return nil
}

// GetDeadLetter returns the dead letter id of subscription, whatever its
// status; projector.ErrNotFound when there is none.
func GetDeadLetter(ctx context.Context, store *postgres.Store, subscription string, id int64) (DeadLetter, error) {
	rows, err := store.Pool().Query(ctx, `SELECT `+deadLetterColumns+` FROM `+store.Table("projector_jetstream_dead_letters")+`
		WHERE id = $1 AND subscription = $2`, id, subscription)
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

// DiscardDeadLetter marks the open dead letter id of subscription discarded
// without running its handler: the operator's decision that its effects are
// not wanted, kept for the record. The event stays claimed and its stream
// past it, so it is never applied later either. A missing id is
// projector.ErrNotFound; one that is resolved or discarded already is
// [ErrDeadLetterNotOpen]. It waits for a retry of the same dead letter in
// progress and then, if the retry resolved it, is refused, so an event is
// either retried or discarded, never both.
func DiscardDeadLetter(ctx context.Context, store *postgres.Store, subscription string, id int64) error {
	table := store.Table("projector_jetstream_dead_letters")
	// A conditional update: behind a retry holding the row, PostgreSQL
	// checks the status again on the row the retry committed.
	tag, err := store.Pool().Exec(ctx, `UPDATE `+table+` SET status = 'discarded', resolved_at = now()
		WHERE id = $1 AND subscription = $2 AND status = 'open'`, id, subscription)
	if err != nil {
		return fmt.Errorf("discard jetstream dead letter %d: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	// Say why: a status never goes back to open, so what this reads is
	// what refused the update.
	var status string
	err = store.Pool().QueryRow(ctx, `SELECT status FROM `+table+` WHERE id = $1 AND subscription = $2`, id, subscription).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("discard jetstream dead letter %d of %s: %w", id, subscription, projector.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("discard jetstream dead letter %d: %w", id, err)
	}
	return fmt.Errorf("discard jetstream dead letter %d of %s: it is %s already: %w", id, subscription, status, ErrDeadLetterNotOpen)
}

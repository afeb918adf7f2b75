package jetstream

// Parking (ConsumerConfig.ErrorMode = ParkStream): a message whose handler
// failed MaxDeliver times parks its source stream for the subscription,
// and the stream's later messages join the park, in version order, without
// reaching the handler, until an operator retries or discards the park.
// Migration 0024 has the tables (why not projector_parks: see there).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrorMode says what the claims consumer does with a message whose handler
// failed MaxDeliver times.
type ErrorMode int

const (
	// DeadLetterMessage writes the message to the dead letters, acknowledges
	// it and moves its stream past it: the stream's later messages are
	// applied on top of the hole. The default.
	DeadLetterMessage ErrorMode = iota
	// ParkStream parks the message's source stream for the subscription:
	// the message and every later one of its stream are stored in the
	// consumer's database in version order (claimed and acknowledged in
	// the transaction that stores them), never reaching the handler, until
	// [Consumer.RetryPark] applies the whole sequence or [DiscardPark]
	// gives it up. Other streams go on. Messages that cannot be decoded
	// have no stream and are still dead-lettered.
	ParkStream
)

// String renders the mode as logs and docs name it.
func (m ErrorMode) String() string {
	if m == ParkStream {
		return "park-stream"
	}
	return "dead-letter"
}

// ErrParkNotOpen: a retry or a discard of a park that is resolved or
// discarded already; of operators racing on one park exactly one wins and
// the others get this. It matches [projector.ErrInvalidTransition].
var ErrParkNotOpen = fmt.Errorf("%w: the park is not open", projector.ErrInvalidTransition)

// Park is one parked stream of a claims consumer's subscription.
type Park struct {
	ID           int64  `json:"id"`
	Subscription string `json:"subscription"`
	Tenant       string `json:"tenant"`
	StreamType   string `json:"stream_type"`
	StreamID     string `json:"stream_id"`
	// Status is [projection.ParkOpen] ("parked"), [projection.ParkResolved]
	// or [projection.ParkDiscarded].
	Status string `json:"status"`
	// EventID, EventType and Version are the event that failed and parked
	// the stream.
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
	Version   int64     `json:"version"`
	// Error is the last failure: the one that parked the stream, or that of
	// the last failed retry.
	Error string `json:"error"`
	// Failures counts the handler's failures: MaxDeliver when parked, one
	// more for each failed retry.
	Failures      int        `json:"failures"`
	ParkedAt      time.Time  `json:"parked_at"`
	LastRetriedAt *time.Time `json:"last_retried_at,omitempty"`
	ResolvedAt    *time.Time `json:"resolved_at,omitempty"`
	// ResolvedBy is who retried (resolved) or discarded it.
	ResolvedBy string `json:"resolved_by,omitempty"`
	// Messages is how many messages the parked sequence holds (open), or
	// held when it was resolved or discarded.
	Messages int `json:"messages"`
}

// Stream returns the parked stream.
func (p Park) Stream() projector.StreamRef {
	return projector.StreamRef{Tenant: p.Tenant, Type: p.StreamType, ID: p.StreamID}
}

// ParkedMessage is one message of a park's sequence.
type ParkedMessage struct {
	Version  int64       `json:"version"`
	EventID  uuid.UUID   `json:"event_id"`
	Subject  string      `json:"subject"`
	Header   nats.Header `json:"headers"`
	Data     []byte      `json:"data"`
	ParkedAt time.Time   `json:"parked_at"`
}

// parkSQL is what the consumer runs on the park tables.
type parkSQL struct {
	open, park, hold, countOpen string
}

func buildParkSQL(s *postgres.Store) parkSQL {
	p, m := s.Table("projector_jetstream_parks"), s.Table("projector_jetstream_parked_messages")
	return parkSQL{
		open: `SELECT id FROM ` + p + ` WHERE subscription = $1 AND tenant_id = $2 AND stream_type = $3 AND stream_id = $4 AND status = 'parked'`,
		// The no-op update on conflict (the stream is parked already)
		// returns the open park's id.
		park: `INSERT INTO ` + p + ` AS p (subscription, tenant_id, stream_type, stream_id, event_id, event_type, version, error, failures)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
			ON CONFLICT (subscription, tenant_id, stream_type, stream_id) WHERE status = 'parked'
			DO UPDATE SET failures = p.failures RETURNING id`,
		hold:      `INSERT INTO ` + m + ` (park_id, version, event_id, subject, headers, data) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		countOpen: `SELECT count(*), coalesce(extract(epoch FROM now() - min(parked_at))::float8, 0) FROM ` + p + ` WHERE subscription = $1 AND status = 'parked'`,
	}
}

// openPark returns the id of ev's stream's open park, or 0. It runs under
// the stream's row lock (order), which retries and discards take too.
func (c *Consumer) openPark(ctx context.Context, tx pgx.Tx, ev projector.Event) (int64, error) {
	s := ev.Stream
	var id int64
	err := tx.QueryRow(ctx, c.park.open, c.cfg.Subscription, s.Tenant, s.Type, s.ID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: read its park: %w", s, err)
	}
	return id, nil
}

// holdInPark stores msg (the event ev) at the end of park id's sequence.
func (c *Consumer) holdInPark(ctx context.Context, tx pgx.Tx, id int64, msg jetstream.Msg, ev projector.Event) error {
	headers, err := json.Marshal(storableHeaders(msg.Headers()))
	if err != nil {
		return fmt.Errorf("park event %s: encode headers: %w", ev.ID, err)
	}
	if _, err := tx.Exec(ctx, c.park.hold, id, ev.Version, ev.ID, storableText(msg.Subject()), headers, msg.Data()); err != nil {
		return fmt.Errorf("park event %s in park %d: %w", ev.ID, id, err)
	}
	return nil
}

// parkStream parks ev's stream with msg as the failing message, in one
// transaction that claims the event, moves the stream's version past it
// (so its successors reach the park, not a hold) and stores it, then
// acknowledges the message. The stream's order is checked again under its
// row lock: a message settled meanwhile (by another consumer of the
// subscription) is a duplicate.
func (c *Consumer) parkStream(ctx context.Context, msg jetstream.Msg, ev projector.Event, failures int64, cause error) (Outcome, error) {
	outcome := Parked
	var parkID int64
	err := pgx.BeginFunc(ctx, c.cfg.Store.Pool(), func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, c.sql.claim, c.cfg.Subscription, ev.ID)
		if err != nil {
			return fmt.Errorf("claim event %s: %w", ev.ID, err)
		}
		if tag.RowsAffected() == 0 {
			outcome = Duplicate
			return errSettled
		}
		if o, err := c.order(ctx, tx, ev); err != nil || o != Applied {
			outcome = o
			return cmp.Or(err, errSettled)
		}
		s := ev.Stream
		if err := tx.QueryRow(ctx, c.park.park, c.cfg.Subscription, s.Tenant, s.Type, s.ID, ev.ID, ev.Type, ev.Version,
			storableText(projection.StoredError(cause)), failures).Scan(&parkID); err != nil {
			return fmt.Errorf("park stream %s: %w", s, err)
		}
		if err := c.holdInPark(ctx, tx, parkID, msg, ev); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, c.sql.clearFailures, c.cfg.Subscription, ev.ID); err != nil {
			return fmt.Errorf("event %s: clear its failure count: %w", ev.ID, err)
		}
		return nil
	})
	switch {
	case errors.Is(err, errSettled) && outcome == Held:
		return Held, c.hold(msg, ev)
	case errors.Is(err, errSettled):
		return outcome, msg.DoubleAck(ctx)
	case err != nil:
		return "", err
	}
	// The message's process span: its handler failed, whatever the
	// outcome's name (a message that only joins a park did not).
	trace.SpanFromContext(ctx).SetStatus(codes.Error, "handler failed: stream parked")
	c.logger.Error("jetstream consumer: stream parked (its later messages wait in the park until it is retried or discarded)",
		"subscription", c.cfg.Subscription, "park", parkID, "stream", ev.Stream.String(), "version", ev.Version, "event_id", ev.ID,
		"failures", failures, "err", cause)
	c.refreshMetrics(ctx)
	if err := msg.DoubleAck(ctx); err != nil {
		return Parked, fmt.Errorf("ack parked message: %w", err)
	}
	return Parked, nil
}

const parkColumns = `id, subscription, tenant_id, stream_type, stream_id, status, event_id, event_type, version, error, failures,
	parked_at, last_retried_at, resolved_at, coalesce(resolved_by, ''),
	CASE WHEN status = 'parked' THEN (SELECT count(*) FROM %s m WHERE m.park_id = p.id) ELSE coalesce(events, 0) END`

func parkSelect(s *postgres.Store) string {
	return `SELECT ` + fmt.Sprintf(parkColumns, s.Table("projector_jetstream_parked_messages")) + ` FROM ` + s.Table("projector_jetstream_parks") + ` p `
}

func scanPark(r pgx.CollectableRow) (Park, error) {
	var p Park
	err := r.Scan(&p.ID, &p.Subscription, &p.Tenant, &p.StreamType, &p.StreamID, &p.Status, &p.EventID, &p.EventType, &p.Version,
		&p.Error, &p.Failures, &p.ParkedAt, &p.LastRetriedAt, &p.ResolvedAt, &p.ResolvedBy, &p.Messages)
	return p, err
}

// ParkFilter selects a subscription's parks for [ListParks].
type ParkFilter struct {
	// Subscription is required ([ValidateSubscription]).
	Subscription string
	// Status is "parked", "resolved", "discarded", or "" for all.
	Status string
	// AfterID pages: only parks with a larger id; 0 starts at the oldest.
	AfterID int64
	// Limit caps the rows returned, 1..10000; 0 means 100.
	Limit int
}

// validParkStatus is ListParks' status check: the dispatcher's park
// statuses, which mean the same here.
func validParkStatus(status string) error {
	if projection.ValidateParkStatus(status) != nil {
		return fmt.Errorf("%w: park status %s: want parked, resolved, discarded or all", ErrInvalidConfig, projector.Quoted(status))
	}
	return nil
}

// ListParks returns the parks f selects, oldest (lowest id) first. A bad
// subscription, status, limit or a negative AfterID matches
// [ErrInvalidConfig], and nothing is read.
func ListParks(ctx context.Context, store *postgres.Store, f ParkFilter) ([]Park, error) {
	if err := validateListing("list jetstream parks", f.Subscription, f.Limit, f.AfterID, f.Status, validParkStatus); err != nil {
		return nil, err
	}
	rows, err := store.Pool().Query(ctx, parkSelect(store)+`WHERE subscription = $1 AND ($2 = '' OR status = $2) AND id > $3 ORDER BY id LIMIT $4`,
		f.Subscription, f.Status, f.AfterID, cmp.Or(f.Limit, 100))
	if err != nil {
		return nil, fmt.Errorf("list jetstream parks: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanPark)
	if err != nil {
		return nil, fmt.Errorf("list jetstream parks: %w", err)
	}
	return out, nil
}

// getPark reads park id of subscription; projector.ErrNotFound if none.
func getPark(ctx context.Context, db postgres.DBTX, store *postgres.Store, subscription string, id int64, forUpdate bool) (Park, error) {
	q := parkSelect(store) + `WHERE id = $1 AND subscription = $2`
	if forUpdate {
		q += ` FOR UPDATE OF p`
	}
	rows, err := db.Query(ctx, q, id, subscription)
	if err != nil {
		return Park{}, fmt.Errorf("jetstream park %d: %w", id, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanPark)
	if errors.Is(err, pgx.ErrNoRows) {
		return Park{}, fmt.Errorf("jetstream park %d of %s: %w", id, subscription, projector.ErrNotFound)
	}
	if err != nil {
		return Park{}, fmt.Errorf("jetstream park %d: %w", id, err)
	}
	return p, nil
}

// parkedMessages reads park id's sequence in version order.
func parkedMessages(ctx context.Context, db postgres.DBTX, store *postgres.Store, id int64) ([]ParkedMessage, error) {
	rows, err := db.Query(ctx, `SELECT version, event_id, subject, headers, data, parked_at FROM `+store.Table("projector_jetstream_parked_messages")+`
		WHERE park_id = $1 ORDER BY version`, id)
	if err != nil {
		return nil, fmt.Errorf("jetstream park %d: read its messages: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedMessage, error) {
		var m ParkedMessage
		return m, r.Scan(&m.Version, &m.EventID, &m.Subject, &m.Header, &m.Data, &m.ParkedAt)
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream park %d: read its messages: %w", id, err)
	}
	return out, nil
}

// GetPark returns park id of subscription, whatever its status, with its
// parked sequence (empty once resolved or discarded);
// projector.ErrNotFound when there is none.
func GetPark(ctx context.Context, store *postgres.Store, subscription string, id int64) (Park, []ParkedMessage, error) {
	p, err := getPark(ctx, store.Pool(), store, subscription, id, false)
	if err != nil {
		return Park{}, nil, err
	}
	msgs, err := parkedMessages(ctx, store.Pool(), store, id)
	if err != nil {
		return Park{}, nil, err
	}
	return p, msgs, nil
}

// lockParkedStream takes, in tx, the row lock of park id's stream (the one
// the consumer holds while it applies or parks a message of the stream)
// and then the park's, and returns the park as it is under them: a racing
// retry or discard that committed first is seen. The order (stream, then
// park) is the consumer's too.
func lockParkedStream(ctx context.Context, tx pgx.Tx, store *postgres.Store, subscription string, id int64) (Park, error) {
	p, err := getPark(ctx, tx, store, subscription, id, false)
	if err != nil {
		return Park{}, err
	}
	s := p.Stream()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+store.Table("projector_jetstream_streams")+`
		WHERE subscription = $1 AND tenant_id = $2 AND stream_type = $3 AND stream_id = $4 FOR UPDATE`, subscription, s.Tenant, s.Type, s.ID); err != nil {
		return Park{}, fmt.Errorf("jetstream park %d: lock stream %s: %w", id, s, err)
	}
	return getPark(ctx, tx, store, subscription, id, true)
}

// ParkRetryFailedError is [Consumer.RetryPark]'s error when the retry ran
// and the handler failed again on one of the parked events: every effect
// of the retry rolled back, and the park stays open with Err as its error
// and one more failure. errors.Is and errors.As reach Err.
type ParkRetryFailedError struct {
	ID           int64
	Subscription string
	EventID      uuid.UUID
	Version      int64
	Err          error
}

func (e *ParkRetryFailedError) Error() string {
	return fmt.Sprintf("retry jetstream park %d of %s: event %s (v%d): the handler failed again, the park stays open: %v",
		e.ID, e.Subscription, e.EventID, e.Version, e.Err)
}

func (e *ParkRetryFailedError) Unwrap() error { return e.Err }

// RetryPark applies park id's whole sequence through the consumer's
// handler, in version order, in one transaction that also marks the park
// resolved by by (who, kept for the record, [projection.ValidateOperator]):
// all the effects and the status commit together, and the stream is live
// again. It holds the stream's row lock, which the consumer takes before
// it applies or parks a message of the stream, so a message arriving during
// the retry waits and is then applied after the parked ones, never ahead,
// never lost. If the handler fails on any event, every effect of the retry
// rolls back, the park stays open with the new error and one more failure,
// and a [*ParkRetryFailedError] is returned; a retry aborted by a conflict
// or a lost connection is tried again, as [Consumer.RetryDeadLetter] says.
// A park that is not open is [ErrParkNotOpen] (of racing retries and discards exactly one wins); a
// missing one projector.ErrNotFound. It returns how many events it applied.
func (c *Consumer) RetryPark(ctx context.Context, id int64, by string) (int, error) {
	if err := projection.ValidateOperator(by); err != nil {
		return 0, err
	}
	store := c.cfg.Store
	var herr error
	var failed ParkedMessage
	var n int
	err := pgretry.Do(ctx, fmt.Sprintf("retry jetstream park %d of %s", id, c.cfg.Subscription), pgretry.Retryable, func() error {
		return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			var err error
			n, failed, herr, err = c.retryParkTx(ctx, tx, id, by)
			return err
		})
	})
	if err != nil {
		return 0, err
	}
	if herr != nil {
		c.logger.WarnContext(ctx, "jetstream consumer: park retried, failed again", "subscription", c.cfg.Subscription, "park", id, "err", herr)
		return 0, &ParkRetryFailedError{ID: id, Subscription: c.cfg.Subscription, EventID: failed.EventID, Version: failed.Version, Err: herr}
	}
	c.logger.InfoContext(ctx, "jetstream consumer: park retried and resolved", "subscription", c.cfg.Subscription, "park", id, "events", n, "by", by)
	c.refreshMetrics(ctx)
	return n, nil
}

// retryParkTx is one try of [Consumer.RetryPark] in tx: it returns how many
// events the park held, and the handler's failure with the message it
// failed on, recorded on the park, unless it is systemic or
// pgretry.Retryable: then it is tx's error (err), and the whole
// transaction goes.
func (c *Consumer) retryParkTx(ctx context.Context, tx pgx.Tx, id int64, by string) (n int, failed ParkedMessage, herr, err error) {
	store := c.cfg.Store
	pt, mt := store.Table("projector_jetstream_parks"), store.Table("projector_jetstream_parked_messages")
	p, err := lockParkedStream(ctx, tx, store, c.cfg.Subscription, id)
	if err != nil {
		return 0, failed, nil, fmt.Errorf("retry: %w", err)
	}
	if p.Status != projection.ParkOpen {
		return 0, failed, nil, fmt.Errorf("retry jetstream park %d of %s: it is %s already (nothing applied again): %w", id, c.cfg.Subscription, p.Status, ErrParkNotOpen)
	}
	msgs, err := parkedMessages(ctx, tx, store, id)
	if err != nil {
		return 0, failed, nil, err
	}
	n = len(msgs)
	// The status and the effects in a savepoint: a failing handler (an SQL
	// error aborts the transaction) rolls back all of them and the tenant
	// scope, leaving the transaction to record the failure. The status is
	// written before the scope, which only narrows privileges.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return n, failed, nil, fmt.Errorf("retry jetstream park %d: %w", id, err)
	}
	if _, err := sp.Exec(ctx, `DELETE FROM `+mt+` WHERE park_id = $1`, id); err != nil {
		return n, failed, nil, fmt.Errorf("retry jetstream park %d: %w", id, err)
	}
	if _, err := sp.Exec(ctx, `UPDATE `+pt+` SET status = 'resolved', resolved_at = now(), resolved_by = $2, events = $3, last_retried_at = now()
		WHERE id = $1`, id, by, len(msgs)); err != nil {
		return n, failed, nil, fmt.Errorf("retry jetstream park %d: mark it resolved: %w", id, err)
	}
	if err := store.ScopeTx(ctx, sp, p.Stream().Tenant); err != nil {
		return n, failed, nil, err
	}
	for _, m := range msgs {
		ev, err := Decode(store.Registry(), m.Header, m.Data)
		if err == nil {
			err = c.handle(ctx, sp, ev)
		}
		if err != nil {
			// Recorded and returned without the personal values of ev the
			// handler may quote (projection.StoredError).
			herr, failed = projection.RedactError(err, projection.OpenedEvents(store.Registry(), ev)...), m
			break
		}
	}
	if herr == nil {
		if err := sp.Commit(ctx); err != nil {
			return n, failed, nil, fmt.Errorf("retry jetstream park %d: %w", id, err)
		}
		return n, failed, nil, nil
	}
	if projection.IsSystemic(herr) || pgretry.Retryable(herr) {
		return n, failed, nil, herr // nothing about this park: the whole transaction goes (tried again after a conflict)
	}
	if err := sp.Rollback(ctx); err != nil {
		return n, failed, nil, fmt.Errorf("retry jetstream park %d: roll back the failed handler: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+pt+` SET error = $2, failures = failures + 1, last_retried_at = now() WHERE id = $1`,
		id, storableText(fmt.Sprintf("retry: v%d: %s", failed.Version, projection.StoredError(herr)))); err != nil {
		return n, failed, nil, fmt.Errorf("retry jetstream park %d: record the failed retry: %w", id, err)
	}
	return n, failed, herr, nil
}

// ListParks is [ListParks] of this consumer's subscription, in its own
// database, which may not be the application's (the console lists parks
// through it); f.Subscription is ignored.
func (c *Consumer) ListParks(ctx context.Context, f ParkFilter) ([]Park, error) {
	f.Subscription = c.cfg.Subscription
	return ListParks(ctx, c.cfg.Store, f)
}

// DiscardPark is [DiscardPark] for this consumer's subscription; with a
// Registerer the parked-streams gauge drops at once.
func (c *Consumer) DiscardPark(ctx context.Context, id int64, by string) (Park, error) {
	p, err := DiscardPark(ctx, c.cfg.Store, c.cfg.Subscription, id, by)
	if err == nil {
		c.refreshMetrics(ctx)
	}
	return p, err
}

// DiscardPark gives up on park id of subscription: its parked messages are
// deleted without reaching the handler (they stay claimed, and the stream
// past them, so they are never applied later either) and the park is
// marked discarded with who (by), when and how many messages, kept for the
// record. The stream is live again from its next message. It takes the
// stream's row lock, so no message joins the sequence meanwhile. A park
// that is not open is [ErrParkNotOpen] (of racing retries and discards
// exactly one wins); a missing one projector.ErrNotFound. It returns the
// park as discarded. It needs no handler, so it works from any binary.
func DiscardPark(ctx context.Context, store *postgres.Store, subscription string, id int64, by string) (Park, error) {
	if err := projection.ValidateOperator(by); err != nil {
		return Park{}, err
	}
	if err := ValidateSubscription(subscription); err != nil {
		return Park{}, err
	}
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		p, err := lockParkedStream(ctx, tx, store, subscription, id)
		if err != nil {
			return fmt.Errorf("discard: %w", err)
		}
		if p.Status != projection.ParkOpen {
			return fmt.Errorf("discard jetstream park %d of %s: it is %s already: %w", id, subscription, p.Status, ErrParkNotOpen)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+store.Table("projector_jetstream_parked_messages")+` WHERE park_id = $1`, id); err != nil {
			return fmt.Errorf("discard jetstream park %d: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_jetstream_parks")+` SET status = 'discarded', resolved_at = now(),
			resolved_by = $2, events = $3 WHERE id = $1`, id, by, p.Messages); err != nil {
			return fmt.Errorf("discard jetstream park %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return Park{}, err
	}
	return getPark(ctx, store.Pool(), store, subscription, id, false)
}

// ParkedStreams is how many streams one subscription has parked in one
// schema.
type ParkedStreams struct {
	Schema       string `json:"schema"`
	Subscription string `json:"subscription"`
	Parked       int64  `json:"parked"`
}

// CountParkedStreamsInDatabase counts, per schema of store's database that
// holds claims-consumer park tables this role may read and per
// subscription with any, the open parks: what `projector relay status`
// shows. Schemas the role cannot read, or dropped meanwhile, are left out.
func CountParkedStreamsInDatabase(ctx context.Context, store *postgres.Store) ([]ParkedStreams, error) {
	return countInDatabase[ParkedStreams](ctx, store, "count parked jetstream streams", "projector_jetstream_parks", "parked")
}

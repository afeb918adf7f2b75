package jetstream

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/clientcheck"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Defaults of [ConsumerConfig].
const (
	DefaultMaxDeliver = 5
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = time.Minute
	DefaultHoldDelay  = 500 * time.Millisecond
	// DefaultMetricsEvery is how often [Consumer.Consume] counts the
	// subscription's open dead letters again, as the dispatcher refreshes
	// its gauges.
	DefaultMetricsEvery = projection.DefaultMetricsEvery
)

// Outcome says what [Consumer.Handle] did with a message.
type Outcome string

// Outcomes of [Consumer.Handle].
const (
	Applied      Outcome = "applied"       // the handler ran and its transaction committed
	Duplicate    Outcome = "duplicate"     // already claimed: acknowledged, handler not run
	Held         Outcome = "held"          // predecessor not handled yet: nak with HoldDelay
	Retried      Outcome = "retried"       // handler failed: nak with backoff
	DeadLettered Outcome = "dead-lettered" // written to the dead-letter table and acknowledged
	Parked       Outcome = "parked"        // stored in its stream's park ([ParkStream]) and acknowledged, handler not run
)

// ConsumerHandler applies one event's effects inside tx, which is scoped to
// the event's tenant and also holds the event's claim: both commit or
// neither does.
type ConsumerHandler func(ctx context.Context, tx pgx.Tx, ev projector.Event) error

// ConsumerConfig configures a [Consumer]. Store, Subscription and Handler
// are required.
type ConsumerConfig struct {
	// Store is the consumer's own database: its Projector schema holds the
	// claims (migration 0009), and its registry decodes the messages.
	Store *postgres.Store
	// Subscription names this consumer's claims; two subscriptions of one
	// stream each apply every event once.
	Subscription string
	Handler      ConsumerHandler
	// MaxDeliver is how many times the handler may fail on one event
	// before the message is dead-lettered (or its stream parked, under
	// [ParkStream]); default [DefaultMaxDeliver].
	// Only the handler's failures count (in projector_jetstream_failures),
	// not NATS deliveries: a message held behind its predecessor, or
	// delivered again after a lost acknowledgement, has not failed. Set the
	// JetStream consumer's own MaxDeliver to -1 (unlimited), so JetStream
	// never stops delivering a message this consumer has not settled.
	MaxDeliver int
	// ErrorMode is what happens after MaxDeliver failures: the message is
	// dead-lettered and its stream goes on past it ([DeadLetterMessage],
	// the default), or its stream is parked ([ParkStream]) until an
	// operator retries or discards the park (docs/jetstream.md, "Parked
	// streams").
	ErrorMode ErrorMode
	// Backoff is the nak delay after a handler error, doubled per failure
	// of the event up to MaxBackoff; defaults [DefaultBackoff],
	// [DefaultMaxBackoff].
	Backoff, MaxBackoff time.Duration
	// HoldDelay is the nak delay of an event held for its predecessor;
	// default [DefaultHoldDelay].
	HoldDelay time.Duration
	// AcceptFirstSeen lets a stream this subscription has never handled
	// start at whatever version arrives first (a subscription that starts
	// mid-stream, or a source whose early events were pruned). By default a
	// stream's first handled event must be version 1, so a lost first event
	// is held and visible rather than silently passed.
	AcceptFirstSeen bool
	// Registerer receives the consumer's metrics; nil means none. Its one
	// series, projector_jetstream_dead_letters_open{subscription}, counts
	// the subscription's open dead letters in the table (docs/jetstream.md,
	// Metrics), so an operator learns that some wait for a retry or a
	// discard. Consumers of several subscriptions may share a Registerer,
	// and so may two of one subscription on the same store (the count is
	// the table's, the same from both).
	Registerer prometheus.Registerer
	// MetricsEvery is how often [Consumer.Consume] counts the open dead
	// letters again, which also picks up the retries and discards other
	// processes (the CLI) make; default [DefaultMetricsEvery], between
	// projection.MinMetricsEvery and projection.MaxMetricsEvery. The count
	// is also taken when the consumer writes a dead letter and after a
	// retry or discard through it.
	MetricsEvery time.Duration
	// TracerProvider records one process span per message, continuing the
	// trace of the message's traceparent header, so what the handler
	// appends with its context is part of the producer's trace
	// (docs/tracing.md); default otel.GetTracerProvider(), which does
	// nothing until the application installs an SDK.
	TracerProvider trace.TracerProvider
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Consumer applies relayed events from JetStream to PostgreSQL with
// exactly-once effects: each message's handler runs in a transaction that
// first claims (subscription, event id), so a redelivery of committed work is
// acknowledged and skipped. Per source stream it applies events in version
// order, holding back an event whose predecessor it has not handled.
type Consumer struct {
	cfg    ConsumerConfig
	logger *slog.Logger
	tracer trace.Tracer
	sql    consumerSQL
	park   parkSQL
	// openDeadLetters, parkedStreams and parkedAge are nil without a
	// Registerer.
	openDeadLetters, parkedStreams, parkedAge *prometheus.GaugeVec
}

type consumerSQL struct {
	claim, unclaim, stream, advance, hold, dead, countOpen string
	fail, clearFailures                                    string
}

// NewConsumer returns a consumer; zero fields of cfg take their documented
// defaults. Configuration errors match [ErrInvalidConfig].
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	cfg.MaxDeliver = cmp.Or(cfg.MaxDeliver, DefaultMaxDeliver)
	cfg.Backoff = cmp.Or(cfg.Backoff, DefaultBackoff)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff)
	cfg.HoldDelay = cmp.Or(cfg.HoldDelay, DefaultHoldDelay)
	cfg.MetricsEvery = cmp.Or(cfg.MetricsEvery, DefaultMetricsEvery)
	switch {
	case cfg.Store == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Store is required", ErrInvalidConfig)
	case cfg.Handler == nil:
		return nil, fmt.Errorf("%w: ConsumerConfig.Handler is required", ErrInvalidConfig)
	case ValidateSubscription(cfg.Subscription) != nil:
		return nil, ValidateSubscription(cfg.Subscription)
	case cfg.MaxDeliver < 1 || cfg.Backoff < 0 || cfg.MaxBackoff < cfg.Backoff || cfg.HoldDelay < 0:
		return nil, fmt.Errorf("%w: max deliver %d, backoff %v..%v, hold delay %v", ErrInvalidConfig, cfg.MaxDeliver, cfg.Backoff, cfg.MaxBackoff, cfg.HoldDelay)
	case cfg.ErrorMode != DeadLetterMessage && cfg.ErrorMode != ParkStream:
		return nil, fmt.Errorf("%w: error mode %d: want DeadLetterMessage or ParkStream", ErrInvalidConfig, cfg.ErrorMode)
	case cfg.MetricsEvery < projection.MinMetricsEvery || cfg.MetricsEvery > projection.MaxMetricsEvery:
		return nil, fmt.Errorf("%w: metrics every %v: want %v to %v", ErrInvalidConfig, cfg.MetricsEvery, projection.MinMetricsEvery, projection.MaxMetricsEvery)
	}
	gauge, parked, parkedAge, err := newConsumerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := cfg.Store
	claims, streams, dead := s.Table("projector_jetstream_claims"), s.Table("projector_jetstream_streams"), s.Table("projector_jetstream_dead_letters")
	failures := s.Table("projector_jetstream_failures")
	c := &Consumer{cfg: cfg, logger: cmp.Or(cfg.Logger, slog.Default()), tracer: tracing.Tracer(cfg.TracerProvider), openDeadLetters: gauge, sql: consumerSQL{
		// The claim: a second insert of the same key does nothing, and the
		// handler does not run.
		claim:   `INSERT INTO ` + claims + ` (subscription, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		unclaim: `DELETE FROM ` + claims + ` WHERE subscription = $1 AND event_id = $2`,
		// Locks the stream's row, so two consumers of one subscription
		// apply a stream's events one at a time.
		stream: `SELECT last_version FROM ` + streams + ` WHERE subscription = $1 AND tenant_id = $2 AND stream_type = $3 AND stream_id = $4 FOR UPDATE`,
		advance: `INSERT INTO ` + streams + ` AS s (subscription, tenant_id, stream_type, stream_id, last_version) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (subscription, tenant_id, stream_type, stream_id) DO UPDATE
			SET last_version = excluded.last_version, updated_at = now(),
			    held_version = CASE WHEN s.held_version <= excluded.last_version THEN NULL ELSE s.held_version END,
			    held_max = CASE WHEN s.held_version <= excluded.last_version THEN NULL ELSE s.held_max END,
			    held_since = CASE WHEN s.held_version <= excluded.last_version THEN NULL ELSE s.held_since END`,
		// Widens the held range to take $5: held_version is the lowest
		// version held, held_max the highest (LEAST and GREATEST skip
		// NULLs), so the record names the gap however the redeliveries
		// interleave. It runs under the row lock of the stream read; a hold
		// whose gap is closed records nothing.
		hold: `INSERT INTO ` + streams + ` AS s (subscription, tenant_id, stream_type, stream_id, last_version, held_version, held_max, held_since) VALUES ($1, $2, $3, $4, 0, $5, $5, now())
			ON CONFLICT (subscription, tenant_id, stream_type, stream_id) DO UPDATE
			SET held_version = LEAST(s.held_version, excluded.held_version),
			    held_max = GREATEST(s.held_max, s.held_version, excluded.held_version),
			    held_since = coalesce(s.held_since, now())
			WHERE s.last_version + 1 < excluded.held_version
			  AND (s.held_version IS NULL OR excluded.held_version < s.held_version OR excluded.held_version > coalesce(s.held_max, s.held_version))`,
		dead: `INSERT INTO ` + dead + ` (subscription, event_id, subject, headers, data, error, deliveries) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		// On the partial index of the open ones (migration 0013).
		countOpen: `SELECT count(*) FROM ` + dead + ` WHERE subscription = $1 AND status = 'open'`,
		// Counts one more handler failure of an event (MaxDeliver), outside
		// the handler's rolled-back transaction.
		fail: `INSERT INTO ` + failures + ` AS f (subscription, event_id, failures, last_error) VALUES ($1, $2, 1, $3)
			ON CONFLICT (subscription, event_id) DO UPDATE SET failures = f.failures + 1, last_error = excluded.last_error, failed_at = now()
			RETURNING failures`,
		clearFailures: `DELETE FROM ` + failures + ` WHERE subscription = $1 AND event_id = $2`,
	}}
	c.parkedStreams, c.parkedAge, c.park = parked, parkedAge, buildParkSQL(s)
	return c, nil
}

// Consume runs the consumer on a JetStream consumer until the returned
// context is stopped: cons should be a durable pull consumer with explicit
// acknowledgement and MaxDeliver -1 (see ConsumerConfig.MaxDeliver).
// A systemic failure ([projection.IsSystemic]: a missing table, column or
// grant), of the handler or of the consumer's own database work, stops it
// too: the message is left for redelivery, never dead-lettered, the failure
// is logged at ERROR, and the returned context's Closed channel closes. Fix
// the cause and call Consume again. A lost connection
// ([projection.IsConnectionLoss]) is not dead-lettered either, but the
// consumer goes on: the message comes back after AckWait, on a new
// connection.
// With a Registerer it also counts the subscription's open dead letters at
// once and every MetricsEvery, until ctx is done or consuming stops.
func (c *Consumer) Consume(ctx context.Context, cons jetstream.Consumer) (jetstream.ConsumeContext, error) {
	// A systemic failure stops consuming: cc is set once Consume returns,
	// which ready announces to the goroutine that stops it.
	var cc jetstream.ConsumeContext
	ready := make(chan struct{})
	var stopOnce sync.Once
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		_, err := c.Handle(ctx, msg)
		switch {
		case err == nil:
		case projection.IsSystemic(err) && !projection.IsConnectionLoss(err):
			stopOnce.Do(func() {
				c.logger.Error("jetstream consumer: systemic failure (not about one message): consumer stopped, nothing dead-lettered; fix the cause, then start it again",
					"subscription", c.cfg.Subscription, "subject", msg.Subject(), "err", err)
				go func() {
					<-ready
					if cc != nil {
						cc.Stop()
					}
				}()
			})
		default:
			c.logger.Error("jetstream consumer: message left for redelivery", "subscription", c.cfg.Subscription, "subject", msg.Subject(), "err", err)
		}
	})
	close(ready)
	if err != nil {
		return nil, fmt.Errorf("jetstream consumer %s: consume: %w", c.cfg.Subscription, err)
	}
	if c.openDeadLetters != nil {
		go c.metricsLoop(ctx, cc.Closed())
	}
	return cc, nil
}

// Handle processes one delivered message and acknowledges it (or not) as
// its outcome says. An error means the message was neither acknowledged nor
// settled (the database or NATS failed, or the handler failed with a
// systemic error, which is never dead-lettered); JetStream redelivers it
// after the consumer's AckWait.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) (outcome Outcome, err error) {
	deliveries := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		deliveries = md.NumDelivered
	}
	ctx, span := c.startProcessSpan(ctx, msg, deliveries)
	defer func() { endProcessSpan(span, outcome, err) }()
	ev, err := Decode(c.cfg.Store.Registry(), msg.Headers(), msg.Data())
	if err != nil {
		// Nothing a retry can change: dead-letter it at once.
		return c.deadLetter(ctx, msg, nil, deliveries, err)
	}
	if span.IsRecording() {
		span.SetAttributes(
			tracing.AttrMessagingMessageID.String(ev.ID.String()),
			tracing.AttrStreamTenant.String(projector.Printable(ev.Stream.Tenant)),
			tracing.AttrStreamType.String(projector.Printable(ev.Stream.Type)),
			tracing.AttrStreamID.String(projector.Printable(ev.Stream.ID)),
			tracing.AttrStreamVersion.Int64(ev.Version),
		)
	}
	outcome, err = c.apply(ctx, msg, ev, deliveries > 1)
	switch {
	case err == nil && outcome == Held:
		return Held, c.hold(msg, ev)
	case err == nil:
		return outcome, msg.DoubleAck(ctx)
	case projection.IsSystemic(err):
		// Every message behind this one would fail alike: it is left for
		// redelivery, never dead-lettered, and Consume stops.
		return "", err
	case pgretry.Conflict(err):
		// The handler (or the claim's own statements) lost a conflict
		// with another transaction: a deadlock's victim, a serialization
		// failure. Nothing committed and nothing is about the event, so
		// no failure is counted (MaxDeliver would dead-letter or park a
		// healthy event): it comes back after a short delay.
		if nerr := msg.NakWithDelay(c.backoff(deliveries)); nerr != nil {
			return Retried, fmt.Errorf("nak event %s: %w", ev.ID, nerr)
		}
		c.logger.Warn("jetstream consumer: lost a conflict with another transaction, nothing recorded; retrying", "subscription", c.cfg.Subscription,
			"event_id", ev.ID, "deliveries", deliveries, "err", err)
		return Retried, nil
	case errors.As(err, new(*handlerError)):
		// Counted, parked, dead-lettered and logged without the personal
		// values of ev the handler may quote (projection.StoredError).
		err = projection.RedactError(err, projection.OpenedEvents(c.cfg.Store.Registry(), ev)...)
		failures, ferr := c.countFailure(ctx, ev, err)
		if ferr != nil {
			return "", ferr
		}
		if failures >= int64(c.cfg.MaxDeliver) && c.cfg.ErrorMode == ParkStream {
			return c.parkStream(ctx, msg, ev, failures, err)
		}
		if failures >= int64(c.cfg.MaxDeliver) {
			return c.deadLetter(ctx, msg, &ev, deliveries, err)
		}
		if nerr := msg.NakWithDelay(c.backoff(uint64(failures))); nerr != nil {
			return Retried, fmt.Errorf("nak event %s: %w", ev.ID, nerr)
		}
		c.logger.Warn("jetstream consumer: handler failed, retrying", "subscription", c.cfg.Subscription, "event_id", ev.ID,
			"failures", failures, "deliveries", deliveries, "err", err)
		return Retried, nil
	default:
		return "", err
	}
}

// handlerError marks an error of the user's handler, as opposed to the
// consumer's own database work.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// countFailure records one more handler failure of ev and returns how many
// there were: what MaxDeliver is compared with.
func (c *Consumer) countFailure(ctx context.Context, ev projector.Event, cause error) (int64, error) {
	var n int64
	if err := c.cfg.Store.Pool().QueryRow(ctx, c.sql.fail, c.cfg.Subscription, ev.ID, projection.StoredError(cause)).Scan(&n); err != nil {
		return 0, fmt.Errorf("event %s: count the handler failure: %w", ev.ID, err)
	}
	return n, nil
}

// apply claims the event, checks its stream's order and runs the handler,
// all in one transaction. The claim and the stream bookkeeping are written
// before the transaction is scoped to the tenant, so scoping only ever
// narrows privileges and a tenant role needs no grant on these tables.
// redelivered says the message came before, so earlier handler failures
// may be counted: their record goes with the applied effect. Under
// [ParkStream] an event whose stream is parked joins the park instead
// (Parked), claimed, its handler not run.
func (c *Consumer) apply(ctx context.Context, msg jetstream.Msg, ev projector.Event, redelivered bool) (Outcome, error) {
	outcome := Applied
	err := pgx.BeginFunc(ctx, c.cfg.Store.Pool(), func(tx pgx.Tx) error {
		tag, err := claimChecked(ctx, tx, c.sql.claim, c.cfg.Subscription, ev.ID)
		if err != nil {
			return fmt.Errorf("claim event %s: %w", ev.ID, err)
		}
		if tag.RowsAffected() == 0 {
			outcome = Duplicate
			return nil
		}
		o, err := c.order(ctx, tx, ev)
		outcome = o
		switch {
		case err != nil:
			return err
		case o == Held:
			// Recorded under the stream's row lock that order took, so
			// SkipTo, which takes it too, never misses a hold that is
			// under way; the claim goes, for the event is not applied.
			s := ev.Stream
			if _, err := tx.Exec(ctx, c.sql.hold, c.cfg.Subscription, s.Tenant, s.Type, s.ID, ev.Version); err != nil {
				return fmt.Errorf("stream %s: record held version %d: %w", s, ev.Version, err)
			}
			if _, err := tx.Exec(ctx, c.sql.unclaim, c.cfg.Subscription, ev.ID); err != nil {
				return fmt.Errorf("event %s: withdraw the claim of a held event: %w", ev.ID, err)
			}
			return nil
		case o != Applied:
			return errSettled
		}
		if c.cfg.ErrorMode == ParkStream {
			// Under the stream's row lock order took, which a retry or
			// a discard of the park holds while it runs: the message
			// joins a park still open, or finds it gone and is applied
			// after the whole parked sequence.
			park, err := c.openPark(ctx, tx, ev)
			if err != nil {
				return err
			}
			if park != 0 {
				outcome = Parked
				return c.holdInPark(ctx, tx, park, msg, ev)
			}
		}
		if redelivered {
			if _, err := tx.Exec(ctx, c.sql.clearFailures, c.cfg.Subscription, ev.ID); err != nil {
				return fmt.Errorf("event %s: clear its failure count: %w", ev.ID, err)
			}
		}
		if err := c.cfg.Store.ScopeTx(ctx, tx, ev.Stream.Tenant); err != nil {
			return err
		}
		if err := c.handle(ctx, tx, ev); err != nil {
			return &handlerError{fmt.Errorf("event %s (%s): %w", ev.ID, ev.Type, err)}
		}
		return nil
	})
	if errors.Is(err, errSettled) {
		if outcome == Duplicate {
			// An older version already handled, its claim since purged:
			// settle it with a claim so the next redelivery is cheap.
			if _, cerr := c.cfg.Store.Pool().Exec(ctx, c.sql.claim, c.cfg.Subscription, ev.ID); cerr != nil {
				return "", fmt.Errorf("claim event %s: %w", ev.ID, cerr)
			}
		}
		return outcome, nil
	}
	return outcome, err
}

// errSettled rolls back a transaction whose message needs no handler run.
var errSettled = errors.New("settled without applying")

// order reads the stream's last handled version under a row lock and
// advances it to ev.Version when ev is next; otherwise it says Held (a
// predecessor is missing) or Duplicate (an older version).
func (c *Consumer) order(ctx context.Context, tx pgx.Tx, ev projector.Event) (Outcome, error) {
	s := ev.Stream
	var last int64
	err := tx.QueryRow(ctx, c.sql.stream, c.cfg.Subscription, s.Tenant, s.Type, s.ID).Scan(&last)
	known := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("stream %s: read last version: %w", s, err)
	}
	switch {
	case !known && c.cfg.AcceptFirstSeen:
	case ev.Version <= last:
		return Duplicate, nil
	case ev.Version > last+1:
		return Held, nil
	}
	if _, err := tx.Exec(ctx, c.sql.advance, c.cfg.Subscription, s.Tenant, s.Type, s.ID, ev.Version); err != nil {
		return "", fmt.Errorf("stream %s: advance to version %d: %w", s, ev.Version, err)
	}
	return Applied, nil
}

// hold naks a held message with HoldDelay; apply recorded the hold
// (visible in projector_jetstream_streams and [Gaps]).
func (c *Consumer) hold(msg jetstream.Msg, ev projector.Event) error {
	if err := msg.NakWithDelay(c.cfg.HoldDelay); err != nil {
		return fmt.Errorf("nak held event %s: %w", ev.ID, err)
	}
	return nil
}

// deadLetter writes the message to the dead-letter table, claims the event
// and moves its stream past it (so its successors are not held forever), in
// one transaction, then acknowledges it.
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, ev *projector.Event, deliveries uint64, cause error) (Outcome, error) {
	headers, err := json.Marshal(storableHeaders(msg.Headers()))
	if err != nil {
		return "", fmt.Errorf("dead-letter: encode headers: %w", err)
	}
	var id any
	if ev != nil {
		id = ev.ID
	}
	err = pgx.BeginFunc(ctx, c.cfg.Store.Pool(), func(tx pgx.Tx) error {
		if ev != nil {
			if _, err := tx.Exec(ctx, c.sql.claim, c.cfg.Subscription, ev.ID); err != nil {
				return err
			}
			s := ev.Stream
			if _, err := tx.Exec(ctx, c.sql.advance, c.cfg.Subscription, s.Tenant, s.Type, s.ID, ev.Version); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, c.sql.clearFailures, c.cfg.Subscription, ev.ID); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, c.sql.dead, c.cfg.Subscription, id, storableText(msg.Subject()), headers, msg.Data(), storableText(projection.StoredError(cause)), int64(deliveries))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("dead-letter message on %q: %w", msg.Subject(), err)
	}
	c.logger.Error("jetstream consumer: message dead-lettered", "subscription", c.cfg.Subscription, "subject", msg.Subject(), "deliveries", deliveries, "err", cause)
	c.refreshMetrics(ctx)
	if err := msg.DoubleAck(ctx); err != nil {
		return DeadLettered, fmt.Errorf("ack dead-lettered message: %w", err)
	}
	return DeadLettered, nil
}

// backoff is the nak delay after the event's failures-th handler failure.
func (c *Consumer) backoff(failures uint64) time.Duration {
	d := c.cfg.Backoff
	for i := uint64(1); i < failures && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, c.cfg.MaxBackoff)
}

// ClaimsRetention says which claims [PurgeClaims] may delete. A claim
// matters while its message may still come again: redelivered by the
// JetStream consumer (until some delivery is acknowledged) or published
// again by the relay (inside the stream's duplicate window). OlderThan must
// exceed DuplicateWindow plus MaxRedelivery; docs/jetstream.md suggests a
// day.
type ClaimsRetention struct {
	// Subscription limits the purge to one subscription; "" purges every
	// subscription's claims.
	Subscription string
	// OlderThan is the age past which a claim is deleted.
	OlderThan time.Duration
	// DuplicateWindow is the relay stream's duplicate window (its
	// Duplicates setting; `projector relay status` shows it).
	DuplicateWindow time.Duration
	// MaxRedelivery is the longest a delivered message may still be
	// delivered again: [Consumer.MaxRedelivery] for the JetStream
	// consumer's AckWait.
	MaxRedelivery time.Duration
}

// Validate checks the retention: a known subscription name, a positive
// duplicate window, and OlderThan longer than the window plus the
// redelivery time. Errors match [ErrInvalidConfig].
func (r ClaimsRetention) Validate() error {
	switch {
	case r.Subscription != "" && ValidateSubscription(r.Subscription) != nil:
		return ValidateSubscription(r.Subscription)
	case r.DuplicateWindow <= 0 || r.MaxRedelivery < 0:
		return fmt.Errorf("%w: duplicate window %v and max redelivery %v: want a positive window and a redelivery time of 0 or more", ErrInvalidConfig, r.DuplicateWindow, r.MaxRedelivery)
	case r.OlderThan <= r.DuplicateWindow+r.MaxRedelivery:
		return fmt.Errorf("%w: claims retention %v must exceed the duplicate window %v plus the max redelivery %v: a message may still come again that long", ErrInvalidConfig, r.OlderThan, r.DuplicateWindow, r.MaxRedelivery)
	}
	return nil
}

// PurgeClaims deletes the claims older than r.OlderThan (of one
// subscription or all), returning how many; it refuses a retention that
// fails [ClaimsRetention.Validate]. Per-stream versions are kept, so an
// event older than a stream's last handled version is still recognised
// after its claim is gone. Handler-failure counts (MaxDeliver) whose last
// failure is older than the retention go too: an applied or dead-lettered
// event's count is deleted with it, so what is left that old belongs to an
// event delivered again outside the claims consumer's bookkeeping.
func PurgeClaims(ctx context.Context, store *postgres.Store, r ClaimsRetention) (int64, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	tag, err := store.Pool().Exec(ctx, `DELETE FROM `+store.Table("projector_jetstream_claims")+
		` WHERE claimed_at < now() - make_interval(secs => $1) AND ($2 = '' OR subscription = $2)`, r.OlderThan.Seconds(), r.Subscription)
	if err != nil {
		return 0, fmt.Errorf("purge jetstream claims: %w", err)
	}
	if _, err := store.Pool().Exec(ctx, `DELETE FROM `+store.Table("projector_jetstream_failures")+
		` WHERE failed_at < now() - make_interval(secs => $1) AND ($2 = '' OR subscription = $2)`, r.OlderThan.Seconds(), r.Subscription); err != nil {
		return 0, fmt.Errorf("purge jetstream handler-failure counts: %w", err)
	}
	return tag.RowsAffected(), nil
}

// MaxRedelivery is the longest a message this consumer received may still
// be delivered again by a JetStream consumer whose AckWait is ackWait: each
// of MaxDeliver deliveries may run until AckWait before it is redelivered,
// plus the nak backoffs between them. The floor for a claims retention
// ([ClaimsRetention.MaxRedelivery]). Holds behind a missing predecessor
// do not count: they come before the event's claim exists, and a claim
// only needs to outlive the deliveries that follow it.
func (c *Consumer) MaxRedelivery(ackWait time.Duration) time.Duration {
	d := time.Duration(c.cfg.MaxDeliver) * ackWait
	for i := uint64(1); i < uint64(c.cfg.MaxDeliver); i++ {
		d += c.backoff(i)
	}
	return d
}

// ValidateSubscription checks a subscription name: 1 to 128 ASCII
// letters, digits, '-' or '_' (it is also a JetStream durable name). Errors
// match [ErrInvalidConfig].
func ValidateSubscription(s string) error {
	if !plainToken(s) || len(s) > 128 {
		return fmt.Errorf("%w: subscription %s: want 1..128 ASCII letters, digits, '-' or '_'", ErrInvalidConfig, projector.Quoted(s))
	}
	return nil
}

// ValidateStreamName checks a JetStream stream name as the relay accepts
// it: 1 to 255 ASCII letters, digits, '-' or '_'. Errors match
// [ErrInvalidConfig].
func ValidateStreamName(s string) error {
	if !validStreamName(s) {
		return fmt.Errorf("%w: stream name %s: want 1..255 ASCII letters, digits, '-' or '_'", ErrInvalidConfig, projector.Quoted(s))
	}
	return nil
}

// Subscription returns the consumer's subscription name.
func (c *Consumer) Subscription() string { return c.cfg.Subscription }

// claimChecked runs the claim in tx and, in the same round trip, makes the
// transaction's backend check every second that this process is still
// there (internal/clientcheck): a consumer killed while its handler waits
// for a lock would otherwise keep the claim and its stream's row locked,
// and every delivery of that stream waiting, until the wait ends.
func claimChecked(ctx context.Context, tx pgx.Tx, claim string, args ...any) (pgconn.CommandTag, error) {
	if !clientcheck.Supported(tx.Conn().PgConn()) {
		return tx.Exec(ctx, claim, args...)
	}
	b := &pgx.Batch{}
	b.Queue(clientcheck.SQL)
	b.Queue(claim, args...)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// storableText is s as PostgreSQL text can hold it: invalid UTF-8 and NUL
// bytes become U+FFFD. A dead letter or park records what came in; a
// subject or header that PostgreSQL refused kept the message from being
// recorded at all, and it came back every AckWait, unacknowledged (a relay
// and saga audit).
func storableText(s string) string {
	if projector.ValidText(s) == nil {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// storableHeaders is h with every name and value storableText, for the
// jsonb a dead letter or park keeps them in (jsonb refuses \u0000).
func storableHeaders(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for k, vs := range h {
		values := make([]string, len(vs))
		for i, v := range vs {
			values[i] = storableText(v)
		}
		out[storableText(k)] = append(out[storableText(k)], values...)
	}
	return out
}

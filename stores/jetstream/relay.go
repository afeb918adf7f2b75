package jetstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
)

// Defaults of [RelayConfig].
const (
	DefaultRelayName       = "jetstream_relay"
	DefaultStreamName      = "PROJECTOR"
	DefaultDuplicateWindow = 5 * time.Minute
	DefaultPublishTimeout  = 10 * time.Second
	DefaultMaxPending      = 512
)

// ErrStreamMismatch: the JetStream stream exists with a configuration the
// relay cannot rely on (it does not capture the relay's subjects, its
// duplicate window is shorter than the relay needs, or its storage differs).
// The relay refuses to start rather than publish into it.
var ErrStreamMismatch = errors.New("jetstream: stream configuration does not fit the relay")

// ErrMessageTooLarge: an event's message is bigger than the server accepts
// (its max_payload). The batch fails and is retried like any handler error,
// so the relay halts at that event (nothing after it is published, nothing
// is lost) until the server's limit is raised or the consumer is handled by
// an operator.
var ErrMessageTooLarge = errors.New("jetstream: message larger than the server's max payload")

// RelayConfig configures a [Relay]. Conn and Registry are required.
type RelayConfig struct {
	// Conn is a connection to a NATS server with JetStream enabled. Give it
	// unlimited reconnects (nats.MaxReconnects(-1)) so an outage is waited
	// out rather than ending the connection.
	Conn *nats.Conn
	// Registry is the application's event-type registry; every type it
	// defines is relayed unless Types says otherwise.
	Registry *projector.Registry
	// Types limits the relayed event types; default every defined type.
	Types []string
	// Name is the relay's consumer name in projector_consumers (and in
	// `projector status`); default [DefaultRelayName].
	Name string
	// Stream is the JetStream stream's name; default [DefaultStreamName].
	Stream string
	// Prefix is the first subject token(s); default [DefaultPrefix]. The
	// stream captures <Prefix>.>.
	Prefix string
	// Storage of a stream the relay creates; default file storage. An
	// existing stream must have this storage.
	Storage jetstream.StorageType
	// Replicas of a stream the relay creates; default 1.
	Replicas int
	// DuplicateWindow is the stream's duplicate window: how long a
	// re-published event id is recognised and dropped. It must be longer
	// than the longest time between a publish and the commit of the cursor
	// past it, which includes a crashed relay's downtime until another
	// dispatcher resumes the consumer; it must at least exceed the batch
	// timeout plus the publish timeout. Default [DefaultDuplicateWindow]; an
	// existing stream's window must be at least this long.
	DuplicateWindow time.Duration
	// PublishTimeout bounds the wait for a batch's acknowledgements; past
	// it the batch fails and is published again from the cursor after a
	// backoff. Default [DefaultPublishTimeout].
	PublishTimeout time.Duration
	// MaxPending bounds the asynchronous publishes in flight; default
	// [DefaultMaxPending]. A publish beyond it waits for room.
	MaxPending int
	// Async configures the relay's consumer (batch size, backoff, error
	// mode). RawPayloads is always set: the relay sends the JSON as stored
	// after upcasting and never needs Go payloads.
	Async projection.AsyncConfig
	// Registerer receives the relay's metrics; nil means none.
	Registerer prometheus.Registerer
	// TracerProvider records one publish span per batch, a child of the
	// dispatcher's batch span (docs/tracing.md); default
	// otel.GetTracerProvider(), which does nothing until the application
	// installs an SDK.
	TracerProvider trace.TracerProvider
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Relay publishes the event log to a JetStream stream. It is an async
// consumer: hand [Relay.Async] to a projection.Dispatcher. Each batch is
// published asynchronously, every acknowledgement awaited, and only then
// does the handler return so the dispatcher commits the cursor. A crash or a
// failed publish re-publishes from the cursor; the event id as Nats-Msg-Id
// lets the stream's duplicate window drop what was already stored, and
// beyond the window the relay's read-back of the stream's tail finds the
// events stored past its committed cursor and skips them (see tail.go and
// docs/jetstream.md, "Downtime longer than the duplicate window").
type Relay struct {
	cfg     RelayConfig
	js      jetstream.JetStream
	async   *projection.Async
	metrics relayMetrics
	logger  *slog.Logger
	tracer  trace.Tracer
	// shards holds, per shard of the relay's consumer, the events known
	// stored past its cursor and its pass's NATS failure (relay_shard.go).
	shards relayShards
	// noTailCheck, set by tests only, relies on the duplicate window alone.
	noTailCheck bool
	// afterAcks, set by tests only, runs between the last acknowledgement
	// and the cursor commit.
	afterAcks func()
}

// failedPass remembers the transaction of the pass whose publish failed on
// NATS and the error, until a publish in another pass.
type failedPass struct {
	mu  sync.Mutex
	tx  pgx.Tx
	err error
}

// NewRelay returns a relay; zero fields of cfg take their documented
// defaults. Configuration errors match [ErrInvalidConfig].
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.Name = cmp.Or(cfg.Name, DefaultRelayName)
	cfg.Stream = cmp.Or(cfg.Stream, DefaultStreamName)
	cfg.Prefix = cmp.Or(cfg.Prefix, DefaultPrefix)
	cfg.DuplicateWindow = cmp.Or(cfg.DuplicateWindow, DefaultDuplicateWindow)
	cfg.PublishTimeout = cmp.Or(cfg.PublishTimeout, DefaultPublishTimeout)
	cfg.MaxPending = cmp.Or(cfg.MaxPending, DefaultMaxPending)
	cfg.Replicas = cmp.Or(cfg.Replicas, 1)
	cfg.Async.RawPayloads = true
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: RelayConfig.Conn is required", ErrInvalidConfig)
	case cfg.Registry == nil:
		return nil, fmt.Errorf("%w: RelayConfig.Registry is required", ErrInvalidConfig)
	case cfg.PublishTimeout < 0 || cfg.MaxPending < 1 || cfg.Replicas < 1:
		return nil, fmt.Errorf("%w: negative publish timeout, max pending or replicas", ErrInvalidConfig)
	case cfg.Replicas > 5:
		// JetStream's own limit, said here rather than by the server at Ensure.
		return nil, fmt.Errorf("%w: replicas %d: JetStream keeps at most 5", ErrInvalidConfig, cfg.Replicas)
	case cfg.PublishTimeout < time.Millisecond || cfg.PublishTimeout > time.Hour:
		return nil, fmt.Errorf("%w: publish timeout %v outside 1ms..1h", ErrInvalidConfig, cfg.PublishTimeout)
	case cfg.MaxPending > 1_000_000:
		return nil, fmt.Errorf("%w: max pending %d over 1,000,000", ErrInvalidConfig, cfg.MaxPending)
	case cfg.DuplicateWindow > 7*24*time.Hour:
		// The window is how long the server keeps each message id: a
		// longer one keeps them all in memory for nothing.
		return nil, fmt.Errorf("%w: duplicate window %v over 7 days", ErrInvalidConfig, cfg.DuplicateWindow)
	case cfg.Storage != jetstream.FileStorage && cfg.Storage != jetstream.MemoryStorage:
		return nil, fmt.Errorf("%w: unknown storage %d", ErrInvalidConfig, cfg.Storage)
	case !validStreamName(cfg.Stream):
		return nil, fmt.Errorf("%w: stream name %s: want ASCII letters, digits, '-' or '_'", ErrInvalidConfig, projector.Quoted(cfg.Stream))
	}
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	async := projection.NewAsync(cfg.Name, cfg.Async)
	acfg := async.Config()
	if need := acfg.BatchTimeout + cfg.PublishTimeout; cfg.DuplicateWindow <= need {
		return nil, fmt.Errorf("%w: duplicate window %v must exceed the batch timeout plus the publish timeout (%v)", ErrInvalidConfig, cfg.DuplicateWindow, need)
	}
	types := cfg.Types
	if len(types) == 0 {
		types = cfg.Registry.Names()
	}
	if len(types) == 0 {
		return nil, fmt.Errorf("%w: the registry defines no event types", ErrInvalidConfig)
	}
	js, err := jetstream.New(cfg.Conn,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream relay: %w", err)
	}
	r := &Relay{cfg: cfg, js: js, async: async, logger: cmp.Or(cfg.Logger, slog.Default()), tracer: tracing.Tracer(cfg.TracerProvider)}
	names := make([]projection.TypeName, len(types))
	for i, t := range slices.Sorted(slices.Values(types)) {
		names[i] = typeName(t)
	}
	if err := projection.OnBatch(async, r.publish, names...); err != nil {
		return nil, err
	}
	if r.metrics, err = newRelayMetrics(cfg.Registerer, cfg.Name); err != nil {
		return nil, err
	}
	return r, nil
}

type typeName string

func (t typeName) Name() string { return string(t) }

func validStreamName(s string) bool { return plainToken(s) && len(s) <= 255 }

// Async returns the relay's consumer, for projection.Config.Projections.
func (r *Relay) Async() *projection.Async { return r.async }

// JetStream returns the relay's JetStream context.
func (r *Relay) JetStream() jetstream.JetStream { return r.js }

// StreamConfig returns the configuration of the stream the relay creates.
func (r *Relay) StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        r.cfg.Stream,
		Description: "Projector event log relay",
		Subjects:    []string{r.cfg.Prefix + ".>"},
		Storage:     r.cfg.Storage,
		Replicas:    r.cfg.Replicas,
		Duplicates:  r.cfg.DuplicateWindow,
		Retention:   jetstream.LimitsPolicy,
	}
}

// Ensure creates the relay's stream, or checks that an existing one fits:
// it captures <Prefix>.>, keeps duplicates at least DuplicateWindow long and
// has the configured storage. A stream that does not fit is refused with
// [ErrStreamMismatch] and left as it is. Call it once at start, before the
// dispatcher runs the relay.
func (r *Relay) Ensure(ctx context.Context) (jetstream.Stream, error) {
	want := r.StreamConfig()
	s, err := r.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = r.js.CreateStream(ctx, want)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("jetstream relay: create stream %s: %w", want.Name, err)
		}
		if err == nil {
			return s, nil
		}
		s, err = r.js.Stream(ctx, want.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream relay: look up stream %s: %w", want.Name, err)
	}
	got := s.CachedInfo().Config
	switch {
	case !slices.Contains(got.Subjects, want.Subjects[0]):
		return nil, fmt.Errorf("%w: stream %s captures %q, not %q", ErrStreamMismatch, want.Name, got.Subjects, want.Subjects[0])
	case got.Duplicates < want.Duplicates:
		return nil, fmt.Errorf("%w: stream %s keeps duplicates for %v, the relay needs at least %v", ErrStreamMismatch, want.Name, got.Duplicates, want.Duplicates)
	case got.Storage != want.Storage:
		return nil, fmt.Errorf("%w: stream %s has %s storage, the relay is configured for %s", ErrStreamMismatch, want.Name, got.Storage, want.Storage)
	}
	return s, nil
}

// publish is the relay's batch handler: every event of the batch published
// asynchronously, in per-stream order on one connection, then every
// acknowledgement awaited under PublishTimeout. Any failure fails the whole
// batch, which the dispatcher retries from the cursor after a backoff:
// retrying message by message could reorder a stream.
//
// A failing batch is bisected by the dispatcher, in the same transaction,
// to find the event that fails. A NATS failure (no acknowledgement, NATS
// down, the stream unreadable) is no event's: each half would wait out the
// publish timeout again, log2(batch size) times before the failure is
// recorded. So within the pass of such a failure every later call fails at
// once with the same error, and the outage shows in the shard's state
// (attempts, last error) within one publish timeout.
func (r *Relay) publish(ctx context.Context, tx pgx.Tx, b projection.Batch) (err error) {
	rs := r.shardOf(ctx)
	if prev := rs.failed.in(tx); prev != nil {
		return prev
	}
	defer func() {
		if err != nil && !errors.Is(err, ErrMessageTooLarge) {
			rs.failed.set(tx, err)
		}
	}()
	ctx, span := r.startPublishSpan(ctx, b)
	defer func() { endSpan(span, err) }()
	start := time.Now()
	stored, err := r.skipSet(ctx, rs, b)
	if err != nil {
		r.metrics.failures.Inc()
		return fmt.Errorf("publish batch: find the events already stored past the cursor: %w", err)
	}
	acked := make(map[uuid.UUID]projector.Position, b.Len())
	defer func() { rs.published(acked, err != nil) }()
	maxPayload := r.cfg.Conn.MaxPayload()
	// The fields to redact are those the relay's registry declares and,
	// when the store was opened with another registry, those the store's
	// declares: the store opened them by its declaration, and a relay
	// handed a registry built apart from it must not send them in clear.
	registries := []*projector.Registry{r.cfg.Registry}
	if s, ok := projection.StoreFrom(ctx); ok && s.Registry() != r.cfg.Registry {
		registries = append(registries, s.Registry())
	}
	futures := make([]jetstream.PubAckFuture, 0, b.Len())
	positions := make([]projector.Position, 0, b.Len())
	skipped := 0
	for _, s := range b.Streams {
		for _, ev := range s.Events {
			if _, ok := stored[ev.ID]; ok {
				// Stored by an attempt whose cursor never committed:
				// publishing it again could outlive the duplicate window.
				skipped++
				continue
			}
			redacted := false
			for _, reg := range registries {
				if p, ok := reg.PersonalOf(ev.Type); ok {
					// Personal fields never leave for JetStream, which
					// holds no keys and cannot forget (docs/privacy.md).
					if ev.Data, err = p.Redact(ev.Data); err != nil {
						return fmt.Errorf("event %s (%s): %w", ev.ID, ev.Type, err)
					}
					redacted = true
				}
			}
			msg, err := NewMsg(r.cfg.Prefix, ev)
			if err != nil {
				return err
			}
			if redacted {
				msg.Header.Set(HeaderPersonalRedacted, "true")
			}
			if size := msgSize(msg); maxPayload > 0 && size > maxPayload {
				r.metrics.failures.Inc()
				return fmt.Errorf("%w: event %s (%s) is %d bytes, the server accepts %d", ErrMessageTooLarge, ev.ID, ev.Type, size, maxPayload)
			}
			f, err := r.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID.String()), jetstream.WithExpectStream(r.cfg.Stream))
			if err != nil {
				r.metrics.failures.Inc()
				return fmt.Errorf("publish event %s: %w", ev.ID, err)
			}
			futures = append(futures, f)
			positions = append(positions, ev.Position)
		}
	}
	wait := r.ackWait(ctx)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	dups := 0
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				dups++
			}
			if id, err := uuid.Parse(f.Msg().Header.Get(HeaderEventID)); err == nil {
				acked[id] = positions[i]
			}
		case err := <-f.Err():
			r.metrics.failures.Inc()
			return fmt.Errorf("publish %s: %w", f.Msg().Header.Get(HeaderEventID), err)
		case <-timer.C:
			r.metrics.failures.Inc()
			return fmt.Errorf("publish %s: no acknowledgement within %v: %w", f.Msg().Header.Get(HeaderEventID), wait.Round(time.Millisecond), context.DeadlineExceeded)
		case <-ctx.Done():
			r.metrics.failures.Inc()
			return fmt.Errorf("publish batch: %w", ctx.Err())
		}
	}
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrMessagingBatchCount.Int(len(futures)),
			attribute.Int("projector.relay.duplicates", dups), attribute.Int("projector.relay.skipped", skipped))
	}
	r.metrics.published.Add(float64(len(futures) - dups))
	r.metrics.duplicates.Add(float64(dups))
	r.metrics.skipped.Add(float64(skipped))
	r.metrics.batch.Observe(time.Since(start).Seconds())
	if r.afterAcks != nil {
		r.afterAcks()
	}
	return nil
}

// startPublishSpan starts the span of one batch's publish, a child of the
// dispatcher's batch span that ctx carries. Each message carries its own
// event's trace context (NewMsg), so the span links nothing: the batch span
// already links every event's append.
func (r *Relay) startPublishSpan(ctx context.Context, b projection.Batch) (context.Context, trace.Span) {
	ctx, span := r.tracer.Start(ctx, "publish "+r.cfg.Stream, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(
			tracing.AttrMessagingSystem.String(tracing.MessagingSystemNATS),
			tracing.AttrMessagingOperationName.String("publish"),
			tracing.AttrMessagingOperationType.String("send"),
			tracing.AttrMessagingDestination.String(r.cfg.Stream),
			tracing.AttrConsumer.String(r.cfg.Name),
			attribute.Int("projector.batch.events", b.Len()),
		)
	}
	return ctx, span
}

// endSpan ends span, marked failed by err if there is one.
func endSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// ackWait is how long publish waits for a batch's acknowledgements:
// PublishTimeout, or less when the batch's deadline comes first, so that
// the relay reports NATS's silence as its own failure, which the
// dispatcher records, rather than run into the batch timeout, which it
// retries at once with half the batch and does not record.
func (r *Relay) ackWait(ctx context.Context) time.Duration {
	wait := r.cfg.PublishTimeout
	if deadline, ok := ctx.Deadline(); ok {
		// A tenth of what is left stays for the dispatcher to roll back
		// and record the failure.
		wait = min(wait, time.Until(deadline)*9/10)
	}
	return max(wait, time.Millisecond)
}

// in returns the failure of the pass whose transaction is tx, if its
// publish failed on NATS, wrapped to say so; a call in another pass
// forgets it.
func (f *failedPass) in(tx pgx.Tx) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tx != nil && f.tx == tx {
		return fmt.Errorf("publish batch: not tried again in this pass, NATS failed it already: %w", f.err)
	}
	f.tx, f.err = nil, nil
	return nil
}

func (f *failedPass) set(tx pgx.Tx, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tx, f.err = tx, err
}

// msgSize is what the server counts against max_payload: headers and body.
func msgSize(m *nats.Msg) int64 {
	n := int64(len(m.Data)) + int64(len("NATS/1.0\r\n\r\n"))
	for k, vs := range m.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n
}

type relayMetrics struct {
	published, duplicates, failures prometheus.Counter
	skipped, walked                 prometheus.Counter
	batch                           prometheus.Observer
}

func newRelayMetrics(reg prometheus.Registerer, name string) (relayMetrics, error) {
	labels := prometheus.Labels{"relay": name}
	published := prometheus.NewCounter(prometheus.CounterOpts{Name: "projector_relay_published_total", Help: "Events the relay published and JetStream stored.", ConstLabels: labels})
	duplicates := prometheus.NewCounter(prometheus.CounterOpts{Name: "projector_relay_duplicates_total", Help: "Re-published events JetStream's duplicate window dropped (after a crash or a failed batch).", ConstLabels: labels})
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "projector_relay_publish_failures_total", Help: "Relay batches that failed to publish (NATS down or slow, a message too large); each is retried from the cursor.", ConstLabels: labels})
	skipped := prometheus.NewCounter(prometheus.CounterOpts{Name: "projector_relay_skipped_total", Help: "Events not published again because the stream already held them past the relay's committed cursor (a crash or failed commit after the acknowledgements).", ConstLabels: labels})
	walked := prometheus.NewCounter(prometheus.CounterOpts{Name: "projector_relay_tail_reads_total", Help: "Messages the relay read back from the stream's end to find events stored past its cursor.", ConstLabels: labels})
	batch := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "projector_relay_batch_seconds", Help: "Time to publish a batch and receive every acknowledgement.", ConstLabels: labels})
	m := relayMetrics{published: published, duplicates: duplicates, failures: failures, skipped: skipped, walked: walked, batch: batch}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{published, duplicates, failures, skipped, walked, batch} {
		if err := reg.Register(c); err != nil {
			return relayMetrics{}, fmt.Errorf("jetstream relay: register metrics: %w", err)
		}
	}
	return m, nil
}

package jetstream_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// tracedEnv is an env whose store, relay, dispatcher and consumers record
// every span into rec.
type tracedEnv struct {
	*env
	rec *tracetest.SpanRecorder
	tp  *sdktrace.TracerProvider
}

func newTracedEnv(t *testing.T) *tracedEnv {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracedEnv{env: newEnvAt(t, natsURL(), postgres.Config{TracerProvider: tp}), rec: rec, tp: tp}
}

// relayAll relays everything appended so far with a traced relay and
// dispatcher, and returns once it is in the stream.
func (e *tracedEnv) relayAll() {
	e.t.Helper()
	cfg := e.relayConfig()
	cfg.TracerProvider = e.tp
	r := e.relay(cfg)
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{r.Async()},
		Logger: slog.New(slog.DiscardHandler), TracerProvider: e.tp})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	defer func() {
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
	}()
	if err := d.CatchUp(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// ended returns the ended spans named name once there are at least n.
func (e *tracedEnv) ended(name string, n int) []sdktrace.ReadOnlySpan {
	e.t.Helper()
	var got []sdktrace.ReadOnlySpan
	waitFor(e.t, "ended spans named "+name, 30*time.Second, func() bool {
		got = got[:0]
		for _, s := range e.rec.Ended() {
			if s.Name() == name {
				got = append(got, s)
			}
		}
		return len(got) >= n
	})
	return got
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// appendTraced appends one event to tenant acme's stream id under a
// request span and returns the request's span context.
func (e *tracedEnv) appendTraced(id string) trace.SpanContext {
	e.t.Helper()
	ctx, span := e.tp.Tracer("test").Start(e.ctx, "request")
	defer span.End()
	err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(ctx, tx, projector.TenantStream("acme", "ticket", id), projector.AnyVersion,
			testevents.TicketCommented{Body: "traced", N: 1})
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return span.SpanContext()
}

// The relay puts the stored trace context of a traced event on its message
// as the standard traceparent header, and nothing on an untraced event's;
// its publish span is a child of the dispatcher's batch span.
func TestRelayPublishesTraceContext(t *testing.T) {
	e := newTracedEnv(t)
	e.appendTraced("traced")
	e.append("acme", "untraced", testevents.TicketCommented{Body: "plain", N: 1})
	e.relayAll()

	events := map[string]projector.Event{}
	for _, ev := range e.logEvents() {
		events[ev.ID.String()] = ev
	}
	msgs := e.streamMsgs(e.nc)
	if len(msgs) != 2 {
		t.Fatalf("%d messages in the stream, want 2", len(msgs))
	}
	for _, m := range msgs {
		ev := events[m.Header.Get(pjs.HeaderEventID)]
		got, stored := m.Header.Get("traceparent"), ev.Metadata.Headers["traceparent"]
		switch ev.Stream.ID {
		case "traced":
			if stored == "" || got != stored {
				t.Errorf("traced event: message traceparent %q, stored %q", got, stored)
			}
		case "untraced":
			if _, ok := m.Header["traceparent"]; ok || stored != "" {
				t.Errorf("untraced event: message traceparent %q, stored %q", got, stored)
			}
		default:
			t.Fatalf("unexpected event %v", ev)
		}
	}

	// The two events go out in one batch, or in two when the gap-safe
	// horizon held the second back behind another test's transaction in
	// the database (it once failed so in CI): each publish span is a child
	// of one of the relay's batch spans, and their counts add up to 2.
	var publishes []sdktrace.ReadOnlySpan
	var sent int64
	waitFor(t, "publish spans of both messages", 30*time.Second, func() bool {
		publishes, sent = publishes[:0], 0
		for _, s := range e.rec.Ended() {
			if s.Name() == "publish "+e.stream {
				publishes = append(publishes, s)
				sent += attr(s, "messaging.batch.message_count").AsInt64()
			}
		}
		return sent >= 2
	})
	if sent != 2 {
		t.Errorf("publish spans count %d messages, want 2", sent)
	}
	batches := map[trace.SpanID]trace.TraceID{}
	for _, b := range e.ended("process jetstream_relay", len(publishes)) {
		batches[b.SpanContext().SpanID()] = b.SpanContext().TraceID()
	}
	for _, publish := range publishes {
		if tid, ok := batches[publish.Parent().SpanID()]; !ok || tid != publish.SpanContext().TraceID() {
			t.Errorf("publish span's parent %v is not one of the relay's batch spans", publish.Parent())
		}
		if publish.SpanKind() != trace.SpanKindProducer || attr(publish, "messaging.system").AsString() != "nats" ||
			attr(publish, "messaging.operation.name").AsString() != "publish" || attr(publish, "messaging.batch.message_count").AsInt64() < 1 {
			t.Errorf("publish span kind %v, attributes %v", publish.SpanKind(), publish.Attributes())
		}
	}
}

// The claims consumer's process span continues the trace of the message's
// traceparent (a child of the append span), its handler runs under that
// span, and what the handler appends carries it; a message without a
// traceparent starts a trace of its own.
func TestConsumerContinuesTrace(t *testing.T) {
	e := newTracedEnv(t)
	request := e.appendTraced("traced")
	e.append("acme", "untraced", testevents.TicketCommented{Body: "plain", N: 1})
	e.relayAll()
	appendSpan := e.ended("append ticket", 1)[0]
	if appendSpan.Parent().SpanID() != request.SpanID() {
		t.Fatalf("append span's parent %v, want the request %v", appendSpan.Parent(), request)
	}

	sinkStore := pgtest.Store(t, e.types.Registry, postgres.Config{TracerProvider: e.tp})
	var mu sync.Mutex
	inHandler := map[string]trace.SpanContext{} // stream id → the handler's span
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: sinkStore, Subscription: "traced", TracerProvider: e.tp,
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			mu.Lock()
			inHandler[ev.Stream.ID] = trace.SpanContextFromContext(ctx)
			mu.Unlock()
			_, err := sinkStore.Append(ctx, tx, projector.TenantStream(ev.Stream.Tenant, "ticket", "echo-"+ev.Stream.ID), projector.AnyVersion,
				testevents.TicketCommented{Body: "echo", N: 1})
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("traced"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	spans := e.ended("process traced", 2)

	byStream := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byStream[attr(s, "projector.stream.id").AsString()] = s
	}
	traced, untraced := byStream["traced"], byStream["untraced"]
	if traced == nil || untraced == nil {
		t.Fatalf("process spans by stream: %v", byStream)
	}
	if traced.SpanContext().TraceID() != request.TraceID() || traced.Parent().SpanID() != appendSpan.SpanContext().SpanID() || !traced.Parent().IsRemote() {
		t.Errorf("traced message's process span: trace %s parent %v, want trace %s parent the append span %s",
			traced.SpanContext().TraceID(), traced.Parent(), request.TraceID(), appendSpan.SpanContext().SpanID())
	}
	if traced.SpanKind() != trace.SpanKindConsumer || attr(traced, "messaging.system").AsString() != "nats" ||
		attr(traced, "messaging.destination.subscription.name").AsString() != "traced" || attr(traced, "projector.outcome").AsString() != "applied" {
		t.Errorf("process span kind %v, attributes %v", traced.SpanKind(), traced.Attributes())
	}
	if untraced.Parent().IsValid() || untraced.SpanContext().TraceID() == request.TraceID() {
		t.Errorf("untraced message's process span has parent %v", untraced.Parent())
	}
	mu.Lock()
	if got := inHandler["traced"]; got.SpanID() != traced.SpanContext().SpanID() {
		t.Errorf("handler ran under span %v, want the process span %v", got, traced.SpanContext())
	}
	mu.Unlock()

	// The handler's append is a child of the process span: its stored
	// traceparent is in the producer's trace.
	evs, err := sinkStore.ReadStream(e.ctx, projector.TenantStream("acme", "ticket", "echo-traced"), postgres.StreamQuery{})
	if err != nil || len(evs) != 1 {
		t.Fatalf("read the handler's event: %v, %d events", err, len(evs))
	}
	echoAppend := e.ended("append ticket", 2)
	var found bool
	for _, s := range echoAppend {
		if s.Parent().SpanID() == traced.SpanContext().SpanID() {
			found = s.SpanContext().TraceID() == request.TraceID()
		}
	}
	if !found {
		t.Errorf("no append span under the process span in the request's trace")
	}
	if tp := evs[0].Metadata.Headers["traceparent"]; len(tp) < 35 || tp[3:35] != request.TraceID().String() {
		t.Errorf("handler's event traceparent %q, want trace %s", tp, request.TraceID())
	}
}

// NewMsg writes the standard trace headers only from a valid stored
// traceparent: a malformed or oversized one is left out, never an error.
func TestNewMsgTraceHeaders(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name          string
		headers       map[string]string
		wantTP, wantS string
	}{
		{"valid", map[string]string{"traceparent": tp, "tracestate": "vendor=1", "client": "web"}, tp, "vendor=1"},
		{"no tracestate", map[string]string{"traceparent": tp}, tp, ""},
		{"malformed", map[string]string{"traceparent": "garbage", "tracestate": "vendor=1"}, "", ""},
		{"oversized", map[string]string{"traceparent": tp + strings.Repeat("x", 1<<16)}, "", ""},
		{"none", map[string]string{"client": "web"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := projector.Event{ID: uuid.New(), Type: "note.added", SchemaVersion: 1, Stream: projector.Stream("note", "n1"), Version: 1,
				Metadata: projector.Metadata{Headers: tc.headers}, RecordedAt: time.Now()}
			msg, err := pjs.NewMsg("events", ev)
			if err != nil {
				t.Fatal(err)
			}
			if got := msg.Header.Get(pjs.HeaderTraceParent); got != tc.wantTP {
				t.Errorf("traceparent header %.80q, want %q", got, tc.wantTP)
			}
			if got := msg.Header.Get(pjs.HeaderTraceState); got != tc.wantS {
				t.Errorf("tracestate header %q, want %q", got, tc.wantS)
			}
		})
	}
}

// A message whose traceparent header is malformed is applied like any
// other, under a process span of its own.
func TestConsumerIgnoresMalformedTraceparent(t *testing.T) {
	e := newTracedEnv(t)
	e.append("acme", "bad", testevents.TicketCommented{Body: "plain", N: 1})
	// The log is read gap-safely: another test's open transaction can keep
	// the event below the horizon for a moment.
	var logged []projector.Event
	pgtest.Eventually(t, time.Minute, "the event to be readable", func() bool {
		logged = e.logEvents()
		return len(logged) > 0
	})
	ev := logged[0]
	msg, err := pjs.NewMsg(e.prefix, ev)
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Set(pjs.HeaderTraceParent, "00-zz-\x01-01")
	e.relay(e.relayConfig()) // creates the stream
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "bad", TracerProvider: e.tp, Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("bad"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	span := e.ended("process bad", 1)[0]
	if span.Parent().IsValid() || attr(span, "projector.outcome").AsString() != "applied" {
		t.Fatalf("process span parent %v, attributes %v", span.Parent(), span.Attributes())
	}
	snk.check(t, []projector.Event{ev})
}

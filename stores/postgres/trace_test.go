package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// tracedSetup is setup with a store recording spans into the returned
// recorder, sampled according to sampler.
func tracedSetup(t *testing.T, sampler sdktrace.Sampler) (fixture, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return setup(t, postgres.Config{TracerProvider: tp}), rec, tp.Tracer("test")
}

func (f fixture) appendCtx(t *testing.T, ctx context.Context, stream projector.StreamRef, payloads ...any) []projector.Event {
	t.Helper()
	err := pgx.BeginFunc(ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
		return err
	})
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	got, err := f.store.ReadStream(f.ctx, stream, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestAppendTrace_RecordsTheAppendSpan(t *testing.T) {
	t.Parallel()
	f, rec, tracer := tracedSetup(t, sdktrace.AlwaysSample())
	stream := projector.TenantStream("acme", "ticket", "traced-1")
	// A header already holding a trace context, as a handler's context
	// carries the handled event's: the append must replace it, and must
	// not write into the caller's map.
	stale := "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"
	ctx := projector.WithHeader(projector.WithHeader(f.ctx, "traceparent", stale), "tracestate", "old=1")
	ctx, parent := tracer.Start(ctx, "request")
	events := f.appendCtx(t, ctx, stream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"})
	parent.End()

	var appendSpan sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "append ticket" {
			appendSpan = s
		}
	}
	if appendSpan == nil {
		t.Fatalf("no span named %q among %d ended spans", "append ticket", len(rec.Ended()))
	}
	if appendSpan.Parent().SpanID() != parent.SpanContext().SpanID() || appendSpan.SpanKind() != trace.SpanKindProducer {
		t.Errorf("append span: parent %s kind %s, want parent %s, producer", appendSpan.Parent().SpanID(), appendSpan.SpanKind(), parent.SpanContext().SpanID())
	}
	want := "00-" + appendSpan.SpanContext().TraceID().String() + "-" + appendSpan.SpanContext().SpanID().String() + "-01"
	for i, ev := range events {
		if got := ev.Metadata.Headers["traceparent"]; got != want {
			t.Errorf("event %d traceparent %q, want %q", i, got, want)
		}
		if got, ok := ev.Metadata.Headers["tracestate"]; ok {
			t.Errorf("event %d kept the stale tracestate %q", i, got)
		}
	}
	if got := projector.MetadataFrom(ctx).Headers["traceparent"]; got != stale {
		t.Errorf("the caller's headers changed: traceparent %q", got)
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range appendSpan.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for k, v := range map[attribute.Key]string{
		"messaging.system": "projector", "messaging.operation.type": "send", "messaging.destination.name": "ticket",
		"projector.stream.tenant": "acme", "projector.stream.id": "traced-1",
	} {
		if attrs[k].AsString() != v {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k].String(), v)
		}
	}
	for k, v := range map[attribute.Key]int64{"messaging.batch.message_count": 2, "projector.expected_version": -1, "projector.stream.version": 2} {
		if attrs[k].AsInt64() != v {
			t.Errorf("attribute %s = %s, want %d", k, attrs[k].String(), v)
		}
	}
}

func TestAppendTrace_NothingWithoutASampledSpan(t *testing.T) {
	t.Parallel()
	f, rec, tracer := tracedSetup(t, sdktrace.NeverSample())
	unsampled, span := tracer.Start(f.ctx, "request")
	defer span.End()
	for name, ctx := range map[string]context.Context{"no span": f.ctx, "unsampled span": unsampled} {
		events := f.appendCtx(t, ctx, projector.Stream("ticket", "untraced-"+name), testevents.TicketOpened{Title: "a"})
		if h := events[0].Metadata.Headers; len(h) != 0 {
			t.Errorf("%s: headers %v, want none", name, h)
		}
	}
	if n := len(rec.Started()); n != 0 {
		t.Errorf("%d spans started, want none", n)
	}
}

func TestAppendTrace_FailedAppendIsAnErrorSpan(t *testing.T) {
	t.Parallel()
	f, rec, tracer := tracedSetup(t, sdktrace.AlwaysSample())
	ctx, parent := tracer.Start(f.ctx, "request")
	defer parent.End()
	err := pgx.BeginFunc(ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(ctx, tx, projector.Stream("ticket", "fails"), projector.ExactVersion(3), testevents.TicketOpened{Title: "a"})
		return err
	})
	if err == nil {
		t.Fatal("append at version 3 of a new stream succeeded")
	}
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Status().Code.String() != "Error" {
		t.Fatalf("ended spans %d, want one with status Error", len(ended))
	}
}

package projection_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// tracedEnv is an env whose store and dispatchers record every span into
// rec; tracer starts the test's "request" spans.
type tracedEnv struct {
	*env
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

func newTracedEnv(t *testing.T) *tracedEnv {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	types := testevents.New()
	store := pgtest.Store(t, types.Registry, postgres.Config{TracerProvider: tp})
	e := &env{t: t, ctx: context.Background(), types: types, schema: store.Schema(), store: store}
	return &tracedEnv{env: e, rec: rec, tp: tp, tracer: tp.Tracer("test")}
}

// appendTraced appends one event per request span, all in one transaction
// (so a consumer sees them all at once), and returns each request's span
// context in order.
func (e *tracedEnv) appendTraced(stream string, n int) []trace.SpanContext {
	e.t.Helper()
	var requests []trace.SpanContext
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for i := range n {
			ctx, span := e.tracer.Start(e.ctx, "request")
			_, err := e.store.Append(ctx, tx, projector.Stream("ticket", stream), projector.ExactVersion(int64(i)),
				testevents.TicketOpened{Title: "x"})
			span.End()
			if err != nil {
				return err
			}
			requests = append(requests, span.SpanContext())
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return requests
}

// spans returns the ended spans named name once there are at least n.
func (e *tracedEnv) spans(name string, n int) []sdktrace.ReadOnlySpan {
	e.t.Helper()
	var got []sdktrace.ReadOnlySpan
	eventually(e.t, time.Minute, "ended spans named "+name, func() bool {
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

// producers maps each append span's id to its parent (the request).
func (e *tracedEnv) producers() map[trace.SpanID]trace.SpanID {
	m := map[trace.SpanID]trace.SpanID{}
	for _, s := range e.rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			m[s.SpanContext().SpanID()] = s.Parent().SpanID()
		}
	}
	return m
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func nothing(context.Context, pgx.Tx, projector.Event) error { return nil }

// Each batch span links to the append span of every event it applied, and
// through it to the request that appended the event.
func TestTrace_BatchSpanLinksTheProducers(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	requests := e.appendTraced("linked", 3)
	p := projection.NewAsync("traced", projection.AsyncConfig{})
	must(projection.OnEvent(p, e.types.Opened, nothing))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, TracerProvider: e.tp})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	batch := e.spans("process traced", 1)[0]
	producers := e.producers()
	var linkedRequests []trace.SpanContext
	for _, l := range batch.Links() {
		parent, ok := producers[l.SpanContext.SpanID()]
		if !ok {
			t.Fatalf("link to %s, which is no append span", l.SpanContext.SpanID())
		}
		for _, r := range requests {
			if r.SpanID() == parent {
				linkedRequests = append(linkedRequests, r)
			}
		}
	}
	if len(linkedRequests) != len(requests) {
		t.Fatalf("batch links reach %d requests, want %d", len(linkedRequests), len(requests))
	}
	for i, r := range requests {
		if !linkedRequests[i].Equal(r) {
			t.Errorf("link %d reaches request %s, want %s", i, linkedRequests[i].SpanID(), r.SpanID())
		}
	}
	a := attrs(batch)
	if batch.SpanKind() != trace.SpanKindConsumer || batch.Parent().IsValid() {
		t.Errorf("batch span: kind %s, parent %v; want a consumer root span", batch.SpanKind(), batch.Parent().SpanID())
	}
	for k, v := range map[attribute.Key]string{
		"messaging.system": "projector", "messaging.operation.type": "process", "messaging.consumer.group.name": "traced",
		"projector.consumer": "traced", "projector.instance": projection.SharedInstance,
	} {
		if a[k].AsString() != v {
			t.Errorf("attribute %s = %q, want %q", k, a[k].String(), v)
		}
	}
	for k, v := range map[attribute.Key]int64{"messaging.batch.message_count": 3, "projector.attempt": 1, "projector.links.dropped": 0} {
		if a[k].AsInt64() != v {
			t.Errorf("attribute %s = %s, want %d", k, a[k].String(), v)
		}
	}
	if a["projector.position.first"].AsString() == "" || a["projector.position.last"].AsString() == "" {
		t.Errorf("positions missing: %v", a)
	}
}

// A batch of more events than MaxLinks links the first 128 and says how
// many it left out.
func TestTrace_BatchLinksAreCapped(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	e.appendTraced("many", 140)
	p := projection.NewAsync("capped", projection.AsyncConfig{BatchSize: 500})
	must(projection.OnEvent(p, e.types.Opened, nothing))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, TracerProvider: e.tp})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	batch := e.spans("process capped", 1)[0]
	a := attrs(batch)
	if n := len(batch.Links()); n != 128 || a["projector.links.dropped"].AsInt64() != 12 || a["messaging.batch.message_count"].AsInt64() != 140 {
		t.Fatalf("%d links, %s dropped, batch of %s; want 128, 12, 140", n, a["projector.links.dropped"].String(), a["messaging.batch.message_count"].String())
	}
}

// What a handler emits is appended under the batch span, and the next
// consumer's batch links to that append: a chain of handlers is one path
// through the traces.
func TestTrace_EmitContinuesTheBatch(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	e.appendTraced("chain", 1)
	first := projection.NewAsync("first", projection.AsyncConfig{})
	must(projection.OnEvent(first, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := projection.Emit(ctx, tx, projector.Stream("followup", ev.Stream.ID), projector.NoStream, testevents.TicketClosed{Reason: "auto"})
		return err
	}))
	second := projection.NewAsync("second", projection.AsyncConfig{})
	must(projection.OnEvent(second, e.types.Closed, nothing))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{first, second}, TracerProvider: e.tp})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	eventually(t, time.Minute, "the emitted event to be handled", func() bool {
		if err := d.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		evs, err := e.store.ReadStream(e.ctx, projector.Stream("followup", "chain"), postgres.StreamQuery{})
		return err == nil && len(evs) == 1
	})
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	batch1 := e.spans("process first", 1)[0]
	batch2 := e.spans("process second", 1)[0]
	var emitted sdktrace.ReadOnlySpan
	for _, s := range e.rec.Ended() {
		if s.Name() == "append followup" {
			emitted = s
		}
	}
	if emitted == nil {
		t.Fatal("no append span for the emitted event")
	}
	if emitted.Parent().SpanID() != batch1.SpanContext().SpanID() || emitted.SpanContext().TraceID() != batch1.SpanContext().TraceID() {
		t.Errorf("the emit's append span has parent %s, want the first batch %s", emitted.Parent().SpanID(), batch1.SpanContext().SpanID())
	}
	evs, err := e.store.ReadStream(e.ctx, projector.Stream("followup", "chain"), postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	want := "00-" + emitted.SpanContext().TraceID().String() + "-" + emitted.SpanContext().SpanID().String() + "-01"
	if got := evs[0].Metadata.Headers["traceparent"]; got != want {
		t.Errorf("emitted event's traceparent %q, want %q (not the handled event's)", got, want)
	}
	links := batch2.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != emitted.SpanContext().SpanID() {
		t.Errorf("second batch links %v, want the emit's append span %s", links, emitted.SpanContext().SpanID())
	}
}

// A failed batch's span is an error naming the event, and the retry's
// span counts the attempt.
func TestTrace_FailedBatchAndRetry(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	e.appendTraced("flaky", 1)
	var calls atomic.Int32
	p := projection.NewAsync("flaky", projection.AsyncConfig{MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	must(projection.OnEvent(p, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("flaky dependency")
		}
		return nil
	}))
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}, TracerProvider: e.tp})
	spans := e.spans("process flaky", 2)
	failed, retried := spans[0], spans[1]
	if failed.Status().Code != codes.Error || len(failed.Events()) == 0 || failed.Events()[0].Name != "exception" {
		t.Errorf("failed batch: status %v, events %v; want an error with the exception", failed.Status(), failed.Events())
	}
	if a := attrs(retried); retried.Status().Code == codes.Error || a["projector.attempt"].AsInt64() != 2 {
		t.Errorf("retried batch: status %v, attempt %s; want ok, 2", retried.Status(), a["projector.attempt"].String())
	}
}

// A dispatcher without an SDK records no batch span, and what its handlers
// emit keeps the handled event's trace context, as it keeps every header:
// an untraced hop does not cut the chain.
func TestTrace_UntracedDispatcherPassesTheContextOn(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	e.appendTraced("untraced", 1)
	handled, err := e.store.ReadStream(e.ctx, projector.Stream("ticket", "untraced"), postgres.StreamQuery{})
	if err != nil || len(handled) != 1 || handled[0].Metadata.Headers["traceparent"] == "" {
		t.Fatalf("appended events %v (%v), want one with a traceparent", handled, err)
	}
	p := projection.NewAsync("plain", projection.AsyncConfig{})
	must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := projection.Emit(ctx, tx, projector.Stream("followup", ev.Stream.ID), projector.NoStream, testevents.TicketClosed{Reason: "auto"})
		return err
	}))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}}) // the global provider: no SDK
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := e.store.ReadStream(e.ctx, projector.Stream("followup", "untraced"), postgres.StreamQuery{})
	if err != nil || len(evs) != 1 {
		t.Fatalf("emitted events %v (%v), want one", evs, err)
	}
	if got, want := evs[0].Metadata.Headers["traceparent"], handled[0].Metadata.Headers["traceparent"]; got != want {
		t.Errorf("emitted traceparent %q, want the handled event's %q", got, want)
	}
	for _, s := range e.rec.Started() {
		if s.Name() == "process plain" || s.Name() == "append followup" {
			t.Errorf("span %q recorded without an SDK in the dispatcher", s.Name())
		}
	}
}

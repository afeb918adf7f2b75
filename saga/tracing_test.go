package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// appendUnder appends payloads to stream under a new "request" span of
// tracer and returns the request's span context.
func (e *env) appendUnder(tracer trace.Tracer, stream projector.StreamRef, payloads ...any) trace.SpanContext {
	e.t.Helper()
	ctx, span := tracer.Start(e.ctx, "request")
	defer span.End()
	err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
		return err
	})
	if err != nil {
		e.t.Fatalf("append to %s: %v", stream, err)
	}
	return span.SpanContext()
}

// storedTrace returns the trace and parent span ids in the traceparent of
// the only event of type typ ("" when it has none).
func (e *env) storedTrace(typ string) (trace.TraceID, trace.SpanID, bool) {
	e.t.Helper()
	var tp *string
	err := e.store.Pool().QueryRow(e.ctx, `SELECT headers->>'traceparent' FROM `+e.store.Table("projector_events")+` WHERE type = $1`, typ).Scan(&tp)
	if err != nil {
		e.t.Fatalf("traceparent of %s: %v", typ, err)
	}
	if tp == nil {
		return trace.TraceID{}, trace.SpanID{}, false
	}
	// traceparent: version-traceid-spanid-flags
	tid, err1 := trace.TraceIDFromHex((*tp)[3:35])
	sid, err2 := trace.SpanIDFromHex((*tp)[36:52])
	if err1 != nil || err2 != nil {
		e.t.Fatalf("traceparent %q of %s: %v %v", *tp, typ, err1, err2)
	}
	return tid, sid, true
}

func spansNamed(rec *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// spanByID returns the ended span id, waiting a while for it: a batch's
// span ends just after its commit, which a caught-up dispatcher can report
// first. nil if it never ends.
func spanByID(rec *tracetest.SpanRecorder, id trace.SpanID) sdktrace.ReadOnlySpan {
	for deadline := time.Now().Add(10 * time.Second); ; {
		for _, s := range rec.Ended() {
			if s.SpanContext().SpanID() == id {
				return s
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestSagaStepAndTimeoutTracing: an event's step is a span in the trace of
// the request that appended the event (a child of its append span), linked
// to the dispatcher's batch; what the step appends is a child of the step;
// the timeout it scheduled fires in a root span linked to the scheduling
// step, and what the timeout appends continues the timeout's trace.
func TestSagaStepAndTimeoutTracing(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ty := newTypes()
	e := &env{t: t, ctx: context.Background(), types: ty, store: pgtest.Store(t, ty.Registry, postgres.Config{TracerProvider: tp})}
	clk := newClock()
	s := newSLA(ty, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{TracerProvider: tp})
	tracer := tp.Tracer("test")

	ticket := projector.Stream("ticket", "t-1")
	opened := e.appendUnder(tracer, ticket, testevents.TicketOpened{Title: "printer"})
	commented := e.appendUnder(tracer, ticket, testevents.TicketCommented{Body: "hello"})
	e.catchUp(d)

	steps := spansNamed(rec, "step sla")
	if len(steps) != 2 {
		t.Fatalf("step spans: got %d, want 2", len(steps))
	}
	byTrace := map[trace.TraceID]sdktrace.ReadOnlySpan{}
	for _, st := range steps {
		byTrace[st.SpanContext().TraceID()] = st
		// The parent is the append span, itself a child of the request.
		app := spanByID(rec, st.Parent().SpanID())
		if app == nil || app.Name() != "append ticket" {
			t.Fatalf("step %v: parent %v is not an append span", st.SpanContext().SpanID(), st.Parent().SpanID())
		}
		if len(st.Links()) != 1 {
			t.Errorf("step: links %v, want one to the batch span", st.Links())
		} else if b := spanByID(rec, st.Links()[0].SpanContext.SpanID()); b == nil || b.Name() != "process sla" {
			t.Errorf("step: links %v, want one to the batch span", st.Links())
		}
	}
	openStep, ok := byTrace[opened.TraceID()]
	if !ok {
		t.Fatalf("no step span in the trace of the request that opened the ticket")
	}
	commentStep, ok := byTrace[commented.TraceID()]
	if !ok {
		t.Fatalf("no step span in the trace of the request that commented")
	}

	// The comment's step appended sla.noted as a child of the step: its
	// append span's parent is the step, and the event stores that append.
	tid, sid, ok := e.storedTrace("sla.noted")
	if !ok || tid != commented.TraceID() {
		t.Fatalf("sla.noted: traceparent trace %v (present %v), want the commenting request's %v", tid, ok, commented.TraceID())
	}
	if app := spanByID(rec, sid); app == nil || app.Parent().SpanID() != commentStep.SpanContext().SpanID() {
		t.Fatalf("sla.noted was not appended under the comment's step span")
	}

	// The timeout row keeps the scheduling step's context.
	var stored string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT trace_parent FROM `+e.store.Table("projector_saga_timeouts")).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if want := openStep.SpanContext().SpanID().String(); stored[36:52] != want {
		t.Fatalf("timeout row traceparent %q, want the opening step's span %s", stored, want)
	}

	clk.Advance(2 * time.Hour)
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d timeouts, want 1", n)
	}
	timeouts := spansNamed(rec, "timeout sla")
	if len(timeouts) != 1 {
		t.Fatalf("timeout spans: got %d, want 1", len(timeouts))
	}
	to := timeouts[0]
	if to.Parent().IsValid() {
		t.Errorf("timeout span has parent %v, want a root span", to.Parent())
	}
	if len(to.Links()) != 1 || to.Links()[0].SpanContext.SpanID() != openStep.SpanContext().SpanID() {
		t.Errorf("timeout span links %v, want one to the scheduling step %v", to.Links(), openStep.SpanContext().SpanID())
	}
	if tid, _, ok := e.storedTrace("sla.reminded"); !ok || tid != to.SpanContext().TraceID() {
		t.Errorf("sla.reminded: trace %v, want the timeout span's %v", tid, to.SpanContext().TraceID())
	}
}

// TestSagaTracingOff: without an SDK a step records nothing and a timeout
// row keeps no trace context.
func TestSagaTracingOff(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{TracerProvider: noop.NewTracerProvider()})
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "printer"}, testevents.TicketCommented{Body: "hi"})
	e.catchUp(d)
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_saga_timeouts") + ` WHERE trace_parent IS NULL AND trace_state IS NULL`); n != 1 {
		t.Fatalf("timeouts without trace context: got %d, want 1", n)
	}
	if _, _, ok := e.storedTrace("sla.noted"); ok {
		t.Fatal("sla.noted carries a traceparent with tracing off")
	}
}

// TestSagaTimeoutUntracedRunner: a runner without tracing fires a timeout
// whose row keeps the handled event's context (an untraced dispatcher's
// step); what the timeout appends carries that context unchanged, as an
// untraced handler's appends carry the handled event's, so the chain from
// the request does not break at the runner.
func TestSagaTimeoutUntracedRunner(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ty := newTypes()
	e := &env{t: t, ctx: context.Background(), types: ty, store: pgtest.Store(t, ty.Registry, postgres.Config{TracerProvider: tp})}
	clk := newClock()
	s := newSLA(ty, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{TracerProvider: noop.NewTracerProvider()})
	opened := e.appendUnder(tp.Tracer("test"), projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "printer"})
	e.catchUp(d)

	var openedTP, stored string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT headers->>'traceparent' FROM `+e.store.Table("projector_events")+` WHERE type = 'ticket.opened'`).Scan(&openedTP); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT trace_parent FROM `+e.store.Table("projector_saga_timeouts")).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != openedTP {
		t.Fatalf("timeout row traceparent %q, want the opened event's own %q", stored, openedTP)
	}

	clk.Advance(2 * time.Hour)
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		t.Fatal(err)
	}
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d timeouts, want 1", n)
	}
	var reminded *string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT headers->>'traceparent' FROM `+e.store.Table("projector_events")+` WHERE type = 'sla.reminded'`).Scan(&reminded); err != nil {
		t.Fatal(err)
	}
	if reminded == nil || *reminded != stored {
		t.Fatalf("sla.reminded traceparent %v, want the timeout row's %q (trace %v)", reminded, stored, opened.TraceID())
	}
	if n := len(spansNamed(rec, "timeout sla")); n != 0 {
		t.Fatalf("an untraced runner recorded %d timeout spans", n)
	}
}

// TestPromise17_TraceSurvivesDispatcherKill: the trace context lives in the
// event, not in a process's memory. A process running the saga is
// SIGKILLed inside the step of a traced event, transaction open; the
// process that handles the event afterwards takes the step in the trace of
// the request that appended it, and what the step appends carries it on.
func TestPromise17_TraceSurvivesDispatcherKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills a child process")
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ty := newTypes()
	e := &env{t: t, ctx: context.Background(), types: ty, store: pgtest.Store(t, ty.Registry, postgres.Config{TracerProvider: tp})}
	tracer := tp.Tracer("test")
	ticket := projector.Stream("ticket", "t-kill")
	opened := e.appendUnder(tracer, ticket, testevents.TicketOpened{Title: "printer"})
	commented := e.appendUnder(tracer, ticket, testevents.TicketCommented{Body: "hello"})

	c := e.startChild(1) // dies right after its first step decided
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		c.Kill(t)
		t.Fatalf("the child did not reach its first step:\n%s", c.Output())
	}
	if !c.Killed() || e.instances() != 0 {
		t.Fatalf("child killed %v, %d instances: want killed mid-step, nothing committed\n%s", c.Killed(), e.instances(), c.Output())
	}

	clk := newClock()
	s := newSLA(ty, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{TracerProvider: tp})
	e.catchUp(d)
	traces := map[trace.TraceID]bool{}
	for _, st := range spansNamed(rec, "step sla") {
		traces[st.SpanContext().TraceID()] = true
	}
	if !traces[opened.TraceID()] || !traces[commented.TraceID()] {
		t.Fatalf("after the kill, steps ran in traces %v; want the requests' %v and %v", traces, opened.TraceID(), commented.TraceID())
	}
	if tid, _, ok := e.storedTrace("sla.noted"); !ok || tid != commented.TraceID() {
		t.Fatalf("sla.noted: trace %v (present %v), want the commenting request's %v", tid, ok, commented.TraceID())
	}
}

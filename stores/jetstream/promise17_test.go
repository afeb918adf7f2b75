package jetstream_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// spanCtxs records the span context a handler ran under, by name.
type spanCtxs struct {
	mu sync.Mutex
	m  map[string]trace.SpanContext
}

func (s *spanCtxs) put(name string, ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = trace.SpanContextFromContext(ctx)
}

func (s *spanCtxs) get(name string) trace.SpanContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[name]
}

// TestPromise17_OneTraceEndToEnd follows one request through every hop
// Projector owns: an HTTP handler's span → the append (with an inline
// projection inside it) → the saga consumer's batch (linked to the append)
// → the saga step (a child of the append) → the event the step emits (a
// child of the step) → a second consumer's batch (linked to that append) →
// the relay's publish → the claims consumer in the subscribing service,
// whose process span is a child of the emitted event's append. One trace id
// reaches the end.
func TestPromise17_OneTraceEndToEnd(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	seen := &spanCtxs{m: map[string]trace.SpanContext{}}

	// The inline projection runs in the append's transaction: it is
	// registered with the store.
	inline := projection.NewInline("inline_tickets")
	must(t, projection.OnEvent(inline, testevents.New().Opened, func(ctx context.Context, _ pgx.Tx, _ projector.Event) error {
		seen.put("inline", ctx)
		return nil
	}))
	e := &tracedEnv{env: newEnvAt(t, natsURL(), postgres.Config{TracerProvider: tp, Inline: []postgres.InlineProjection{inline}}), rec: rec, tp: tp}

	// The saga escalates each opened ticket: it appends a comment to a
	// follow-up stream.
	esc := saga.New[struct{}]("escalate", saga.Config{})
	must(t, saga.StartOn(esc, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[struct{}], _ projector.Event, _ testevents.TicketOpened) error {
		in.Append(projector.TenantStream(in.Tenant(), "followup", in.Key()), projector.NoStream, testevents.TicketCommented{Body: "escalated", N: 1})
		in.Complete()
		return nil
	}))
	sagaConsumer, err := esc.Projection(e.store)
	must(t, err)
	second := projection.NewAsync("second", projection.AsyncConfig{})
	must(t, projection.OnEvent(second, e.types.Commented, func(ctx context.Context, _ pgx.Tx, _ projector.Event) error {
		seen.put("second", ctx)
		return nil
	}))
	relayCfg := e.relayConfig()
	relayCfg.TracerProvider = tp
	relay := e.relay(relayCfg)
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{sagaConsumer, second, relay.Async()},
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond, TracerProvider: tp})
	must(t, err)
	must(t, d.Start(e.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})

	// The subscribing service: a claims consumer on its own store.
	sink := pgtest.Store(t, e.types.Registry, postgres.Config{TracerProvider: tp})
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: sink, Subscription: "p17", TracerProvider: tp,
		Handler: func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
			if ev.Stream.Type == "followup" {
				seen.put("claims", ctx)
			}
			return nil
		}})
	must(t, err)
	cc, err := c.Consume(e.ctx, e.jsConsumer("p17"))
	must(t, err)
	defer cc.Stop()

	// The application: an HTTP handler continuing its caller's trace
	// appends the ticket.
	prop := propagation.TraceContext{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tp.Tracer("app").Start(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)), "POST /tickets",
			trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		seen.put("http", ctx)
		err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(ctx, tx, projector.TenantStream("acme", "ticket", "p17"), projector.NoStream, testevents.TicketOpened{Title: "printer"})
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ctx, client := tp.Tracer("app").Start(e.ctx, "client")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/tickets", nil)
	must(t, err)
	prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	res, err := http.DefaultClient.Do(req)
	must(t, err)
	_ = res.Body.Close()
	client.End()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST /tickets: %s", res.Status)
	}
	traceID := client.SpanContext().TraceID()

	waitFor(t, "the claims consumer to handle the emitted event", time.Minute, func() bool { return seen.get("claims").IsValid() })
	_ = d.Stop(e.ctx) // stopped again by the cleanup; here so every batch span has ended

	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	named := func(name string) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range rec.Ended() {
			if s.Name() == name && s.SpanContext().TraceID() == traceID {
				return s
			}
		}
		t.Fatalf("no span %q in the request's trace %s", name, traceID)
		return nil
	}
	linksTo := func(s sdktrace.ReadOnlySpan, target trace.SpanID) bool {
		for _, l := range s.Links() {
			if l.SpanContext.SpanID() == target {
				return true
			}
		}
		return false
	}
	batchLinking := func(name string, target trace.SpanID) sdktrace.ReadOnlySpan {
		t.Helper()
		for _, s := range rec.Ended() {
			if s.Name() == name && linksTo(s, target) {
				return s
			}
		}
		t.Fatalf("no batch span %q links to %s", name, target)
		return nil
	}

	server := named("POST /tickets")
	if server.Parent().SpanID() != client.SpanContext().SpanID() {
		t.Fatalf("HTTP server span's parent %v, want the client", server.Parent())
	}
	appendTicket := named("append ticket")
	if appendTicket.Parent().SpanID() != server.SpanContext().SpanID() {
		t.Fatalf("append's parent %v, want the HTTP handler's span", appendTicket.Parent())
	}
	if seen.get("inline").SpanID() != appendTicket.SpanContext().SpanID() {
		t.Errorf("inline projection ran under %v, want the append span", seen.get("inline"))
	}
	sagaBatch := batchLinking("process escalate", appendTicket.SpanContext().SpanID())
	step := named("step escalate")
	if step.Parent().SpanID() != appendTicket.SpanContext().SpanID() || !linksTo(step, sagaBatch.SpanContext().SpanID()) {
		t.Errorf("saga step: parent %v, links %v; want the append, linked to the saga's batch", step.Parent(), step.Links())
	}
	emitted := named("append followup")
	if emitted.Parent().SpanID() != step.SpanContext().SpanID() {
		t.Errorf("emitted event's append: parent %v, want the saga step", emitted.Parent())
	}
	secondBatch := batchLinking("process second", emitted.SpanContext().SpanID())
	if seen.get("second").SpanID() != secondBatch.SpanContext().SpanID() {
		t.Errorf("second consumer's handler ran under %v, want its batch span", seen.get("second"))
	}
	relayBatch := batchLinking("process jetstream_relay", emitted.SpanContext().SpanID())
	publish := false
	for _, s := range rec.Ended() {
		if s.Name() == "publish "+e.stream && s.Parent().SpanID() == relayBatch.SpanContext().SpanID() {
			publish = true
		}
	}
	if !publish {
		t.Errorf("no publish span under the relay batch that carried the emitted event")
	}
	claims := seen.get("claims")
	if claims.TraceID() != traceID {
		t.Fatalf("the claims consumer's handler ran in trace %s, want the request's %s", claims.TraceID(), traceID)
	}
	if p := byID[claims.SpanID()]; p == nil || p.Parent().SpanID() != emitted.SpanContext().SpanID() {
		t.Errorf("claims consumer's process span is not a child of the emitted event's append span")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

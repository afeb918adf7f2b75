package jetstream_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
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

// oneTrace is what [runOneTrace] leaves for its caller to check.
type oneTrace struct {
	e    *tracedEnv
	seen *spanCtxs
	// client is the span of the HTTP client the trace starts at.
	client trace.SpanContext
	// claims is what the claims consumer's process printed: its
	// handler's trace id, span id and parent span id.
	claims []string
}

// runOneTrace runs one request through every hop Projector owns, traced
// by tp (rec records its spans, or is nil): an HTTP handler's span → the
// append (with an inline projection inside it) → the saga consumer's
// batch → the saga step → the event the step emits → a second consumer's
// batch → the relay's publish → the claims consumer in the subscribing
// service, a process of its own started with extraEnv added to its
// environment. It returns once that process's handler has handled the
// emitted event and the dispatcher has stopped (so every batch span has
// ended).
func runOneTrace(t *testing.T, tp *sdktrace.TracerProvider, rec *tracetest.SpanRecorder, extraEnv ...string) oneTrace {
	t.Helper()
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

	// The subscribing service: a claims consumer on its own store, in a
	// process of its own (this test binary again, runClaimsChild), which
	// says on its output which trace and span its handler ran under.
	sink := pgtest.Store(t, e.types.Registry)
	e.jsConsumer("p17")
	child := pgtest.StartChild(t, append(claimsChildEnv(e.env, "claims", sink.Schema(), "p17"), extraEnv...)...)

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

	var claims []string // trace id, span id, parent span id, as the child printed them
	waitFor(t, "the claims consumer's process to handle the emitted event", time.Minute, func() bool {
		for line := range strings.Lines(child.Output()) {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "claims" {
				claims = f[1:]
				return true
			}
		}
		select {
		case <-child.Done():
			t.Fatalf("the claims consumer's process ended:\n%s", child.Output())
		default:
		}
		return false
	})
	_ = d.Stop(e.ctx) // stopped again by the cleanup; here so every batch span has ended
	return oneTrace{e: e, seen: seen, client: client.SpanContext(), claims: claims}
}

// TestPromise17_OneTraceEndToEnd follows one request through every hop
// Projector owns ([runOneTrace]): an HTTP handler's span → the append
// (with an inline projection inside it) → the saga consumer's batch
// (linked to the append) → the saga step (a child of the append) → the
// event the step emits (a child of the step) → a second consumer's batch
// (linked to that append) → the relay's publish → the claims consumer in
// the subscribing service, a process of its own, whose process span is a
// child of the emitted event's append (the context crosses in the NATS
// message's traceparent header). One trace id reaches the end.
func TestPromise17_OneTraceEndToEnd(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	run := runOneTrace(t, tp, rec)
	e, seen, claims, traceID := run.e, run.seen, run.claims, run.client.TraceID()

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
	if server.Parent().SpanID() != run.client.SpanID() {
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
	if claims[0] != traceID.String() {
		t.Fatalf("the claims consumer's handler, in its own process, ran in trace %s, want the request's %s", claims[0], traceID)
	}
	if claims[2] != emitted.SpanContext().SpanID().String() || claims[1] == claims[2] {
		t.Errorf("claims consumer's process span %s has parent %s, want a child of the emitted event's append span %s",
			claims[1], claims[2], emitted.SpanContext().SpanID())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// childConsumerEnv names the durable JetStream consumer a claims child
// consumes.
const childConsumerEnv = "PROJECTOR_TEST_JS_CHILD_CONSUMER"

// childOTLPEnv, when set, is the OTLP/HTTP URL a claims child exports its
// spans to, as the service childServiceEnv names.
const (
	childOTLPEnv    = "PROJECTOR_TEST_JS_CHILD_OTLP"
	childServiceEnv = "PROJECTOR_TEST_JS_CHILD_SERVICE"
)

// runClaimsChild is the subscribing service of TestPromise17_OneTraceEndToEnd:
// a claims consumer on its own store, with a tracer provider of its own
// (nothing shared with the parent but the database and NATS), consuming
// the parent's durable consumer. When its handler gets the followup event
// it prints "claims <trace id> <span id> <parent span id>" of the span it
// runs under, and keeps consuming until it is killed.
func runClaimsChild() int {
	ctx := context.Background()
	var opts []sdktrace.TracerProviderOption
	if url := os.Getenv(childOTLPEnv); url != "" { // the trace screenshot's run: export to its Jaeger, each span as it ends
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(url))
		if err != nil {
			return childFailed(err)
		}
		opts = append(opts, sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", os.Getenv(childServiceEnv)))))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	defer func() { _ = tp.Shutdown(ctx) }()
	return consumeInChild(ctx, postgres.Config{Registry: testevents.New().Registry, TracerProvider: tp}, func(*postgres.Store) pjs.ConsumerConfig {
		return pjs.ConsumerConfig{Subscription: "p17", TracerProvider: tp, Handler: func(ctx context.Context, _ pgx.Tx, ev projector.Event) error {
			if ev.Stream.Type != "followup" {
				return nil
			}
			sc, parent := trace.SpanContextFromContext(ctx), trace.SpanID{}
			if ro, ok := trace.SpanFromContext(ctx).(sdktrace.ReadOnlySpan); ok {
				parent = ro.Parent().SpanID()
			}
			fmt.Printf("claims %s %s %s\n", sc.TraceID(), sc.SpanID(), parent)
			return nil
		}}
	})
}

package cli

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/jaegertest"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestTracingJaegerEndToEnd exports Projector's spans over OTLP, the way
// `projector run` does, to a real Jaeger started on loopback ports, and
// reads the request's trace back through Jaeger's query API: the request,
// its append, and the dispatcher's batch (a trace of its own, linked).
// Skipped only when the binary is missing and CI is not set; under CI=true
// a missing binary fails (.ci/run builds it with scripts/jaeger-bin).
func TestTracingJaegerEndToEnd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j := jaegertest.Start(ctx, t, jaegertest.Options{})

	tp, err := newTracerProvider(ctx, func(k string) string {
		return map[string]string{envOTelTracesExporter: "otlp", envOTelServiceName: "projector-e2e"}[k]
	}, otlptracehttp.WithEndpointURL(j.OTLP))
	if err != nil || tp == nil {
		t.Fatalf("tracer provider %v: %v", tp, err)
	}
	types := testevents.New()
	store := pgtest.Store(t, types.Registry, postgres.Config{TracerProvider: tp})
	rctx, request := tp.Tracer("e2e").Start(ctx, "request")
	err = pgx.BeginFunc(rctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(rctx, tx, projector.Stream("ticket", "jaeger"), projector.NoStream, testevents.TicketOpened{Title: "traced"})
		return err
	})
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	p := projection.NewAsync("jaeger_e2e", projection.AsyncConfig{})
	if err := projection.OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tp.Shutdown(ctx); err != nil { // flushes the batcher
		t.Fatal(err)
	}

	traceID := request.SpanContext().TraceID().String()
	var ops map[string]string
	j.Poll(ctx, t, "the request's trace in Jaeger", func() bool {
		tr, ok := j.Trace(ctx, t, traceID)
		ops = tr.Operations()
		return ok && len(ops) >= 2
	})
	if ops["request"] == "" || ops["append ticket"] == "" {
		t.Fatalf("trace %s in Jaeger has spans %v, want request and append ticket", traceID, ops)
	}
	j.Poll(ctx, t, "the batch span in Jaeger", func() bool {
		code, body, err := j.Get(ctx, "/api/traces?service=projector-e2e&operation="+strings.ReplaceAll("process jaeger_e2e", " ", "%20"))
		return err == nil && code == http.StatusOK && strings.Contains(string(body), traceID) // its link names the append's trace
	})
}

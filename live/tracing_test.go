package live_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/stores/postgres"
)

// Each fan-out of a committed batch to the clients is a "send <feed>"
// span linked to the append of each event it carries, with what it
// delivered.
func TestLiveFanOutSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := newEnvStore(t, live.Config{TracerProvider: tp}, false, postgres.Config{TracerProvider: tp})
	client := e.connect("acme", "", "")
	defer client.close()

	ctx, request := tp.Tracer("test").Start(e.ctx, "request")
	err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(ctx, tx, projector.TenantStream("acme", "ticket", "l-1"), projector.AnyVersion, testevents.TicketOpened{Title: "x"})
		return err
	})
	request.End()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := client.next(t, time.Minute); !ok {
		t.Fatal("the client got no message")
	}
	var appendSpan, send sdktrace.ReadOnlySpan
	pgtest.Eventually(t, time.Minute, "the fan-out span", func() bool {
		for _, s := range rec.Ended() {
			switch {
			case s.Name() == "append ticket" && s.SpanContext().TraceID() == request.SpanContext().TraceID():
				appendSpan = s
			case s.Name() == "send live" && len(s.Links()) > 0:
				send = s
			}
		}
		return appendSpan != nil && send != nil
	})
	if send.Links()[0].SpanContext.SpanID() != appendSpan.SpanContext().SpanID() || send.Parent().IsValid() {
		t.Errorf("send span: parent %v, links %v; want a root span linked to the append", send.Parent(), send.Links())
	}
	delivered := int64(-1)
	for _, kv := range send.Attributes() {
		if kv.Key == "projector.live.delivered" {
			delivered = kv.Value.AsInt64()
		}
	}
	if delivered != 1 {
		t.Errorf("projector.live.delivered = %d, want 1", delivered)
	}
}

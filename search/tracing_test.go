package search_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// Each batch's call to the search backend is an "index <name>" span under
// the dispatcher's batch span, with the backend, index and operation count.
func TestSearchIndexSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := newEnv(t)
	b, err := pgsearch.New(e.store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := e.ticketProjection("traced_search", b, projection.AsyncConfig{})
	a, err := p.Async()
	if err != nil {
		t.Fatal(err)
	}
	e.append(projector.SystemTenant, "s-1", testevents.TicketOpened{Title: "printer"}, testevents.TicketCommented{Body: "jam", N: 1})
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{a}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		_ = d.Stop(context.WithoutCancel(ctx))
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil { // every batch span has ended
		t.Fatal(err)
	}
	var batch, index sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "process traced_search":
			batch = s
		case "index tickets":
			index = s
		}
	}
	if batch == nil || index == nil {
		t.Fatalf("batch span %v, index span %v", batch, index)
	}
	if index.Parent().SpanID() != batch.SpanContext().SpanID() {
		t.Errorf("index span's parent %v, want the batch span", index.Parent())
	}
	want := map[attribute.Key]string{"projector.search.backend": "pgsearch", "projector.search.index": "tickets"}
	for _, kv := range index.Attributes() {
		if v, ok := want[kv.Key]; ok && kv.Value.AsString() != v {
			t.Errorf("%s = %s, want %s", kv.Key, kv.Value.String(), v)
		}
		if kv.Key == "projector.search.operations" && kv.Value.AsInt64() != 2 {
			t.Errorf("operations %d, want 2", kv.Value.AsInt64())
		}
	}
}

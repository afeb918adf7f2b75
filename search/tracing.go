package search

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector/internal/tracing"
)

// startIndexSpan starts the span of one batch's call to the backend: a
// client span under the dispatcher's batch span, from the batch span's
// provider, so search indexing traces exactly when its dispatcher does.
// Under a batch span that does not record (tracing off, or not sampled)
// it starts nothing.
func startIndexSpan(ctx context.Context, backend, index string, ops []Op, shadow bool) (context.Context, trace.Span) {
	batch := trace.SpanFromContext(ctx)
	if !batch.IsRecording() {
		return ctx, nil
	}
	ctx, span := batch.TracerProvider().Tracer(tracing.ScopeName).Start(ctx, "index "+index, trace.WithSpanKind(trace.SpanKindClient))
	span.SetAttributes(
		attribute.String("projector.search.backend", backend),
		attribute.String("projector.search.index", index),
		attribute.Int("projector.search.operations", len(ops)),
		attribute.Bool("projector.search.shadow", shadow),
	)
	return ctx, span
}

// endIndexSpan ends span (nil when none was started), failed by err.
func endIndexSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "index call failed")
	}
	span.End()
}

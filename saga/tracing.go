package saga

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// Saga span attribute keys, beside the shared ones in internal/tracing.
const (
	attrSaga         = attribute.Key("projector.saga")
	attrSagaKey      = attribute.Key("projector.saga.key")
	attrSagaInstance = attribute.Key("projector.saga.instance")
	attrEventType    = attribute.Key("projector.event.type")
	attrEventPos     = attribute.Key("projector.event.position")
	attrTimeoutName  = attribute.Key("projector.timeout.name")
	attrTimeoutID    = attribute.Key("projector.timeout.id")
	attrTimeoutTries = attribute.Key("projector.attempt")
)

// startStep starts the span of an event's step: a child of the span that
// appended the event (read from its traceparent), so the request that
// appended it and what the saga decided are one trace, linked to the
// dispatcher's batch span that carried it. An event without a valid trace
// context gets a child of the batch span instead.
//
// The tracer is the batch span's provider's, so a saga traces exactly when
// its dispatcher does. When the batch span does not record and the event
// carries no trace context (tracing off), no span is started and no header
// parsed: the step runs under the batch's context unchanged. An event that
// does carry one is continued even under an unsampled batch, so a sampler
// that keeps the request's trace keeps its saga steps too.
func startStep[S any](ctx context.Context, s *Saga[S], in *live[S], ev projector.Event) (context.Context, trace.Span) {
	batch := trace.SpanFromContext(ctx)
	if !batch.IsRecording() && ev.Metadata.Headers[tracing.HeaderTraceParent] == "" {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	parent := ctx
	if sc := tracing.Extract(ev.Metadata.Headers); sc.IsValid() {
		parent = trace.ContextWithRemoteSpanContext(ctx, sc)
		if bsc := batch.SpanContext(); bsc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: bsc}))
		}
	}
	ctx, span := batch.TracerProvider().Tracer(tracing.ScopeName).Start(parent, "step "+s.name, opts...)
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(
		tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
		tracing.AttrMessagingOperationName.String("process"),
		tracing.AttrMessagingOperationType.String("process"),
		tracing.AttrMessagingConsumerGroup.String(s.name),
		tracing.AttrMessagingMessageID.String(ev.ID.String()),
		attrEventType.String(ev.Type),
		attrEventPos.String(ev.Position.String()),
		tracing.AttrStreamTenant.String(ev.Stream.Tenant),
		tracing.AttrStreamType.String(ev.Stream.Type),
		tracing.AttrStreamID.String(ev.Stream.ID),
		tracing.AttrStreamVersion.Int64(ev.Version),
		attrSaga.String(s.name),
		attrSagaKey.String(in.snap.Key),
		attrSagaInstance.String(in.snap.ID.String()),
	)
	return ctx, span
}

// startTimeout starts the span of a timeout's step: a root span (the
// timeout fires long after the trace that scheduled it ended, maybe in
// another process) linked to the span of the step that scheduled it, whose
// context the timeout row keeps. Like the dispatcher's batch span, it
// parses no stored header when it does not record.
//
// The returned context carries the stored context as headers either way,
// as a handler step's carries the handled event's: what an untraced
// runner's timeout appends then keeps the chain from the request through
// the scheduling step, where it would otherwise carry no traceparent at
// all; a recording span's appends replace it with their own (Store.Append).
func startTimeout[S any](ctx context.Context, tracer trace.Tracer, s *Saga[S], c claimed[S]) (context.Context, trace.Span) {
	for k, v := range c.traceCtx {
		if v != "" { // a NULL trace_state is scanned as ""
			ctx = projector.WithHeader(ctx, k, v)
		}
	}
	ctx, span := tracer.Start(ctx, "timeout "+s.name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, span
	}
	if sc := tracing.Extract(c.traceCtx); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
	span.SetAttributes(
		tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
		tracing.AttrMessagingOperationName.String("process"),
		tracing.AttrMessagingOperationType.String("process"),
		tracing.AttrMessagingConsumerGroup.String(s.name),
		tracing.AttrStreamTenant.String(c.snap.Tenant),
		attrSaga.String(s.name),
		attrSagaKey.String(c.snap.Key),
		attrSagaInstance.String(c.snap.ID.String()),
		attrTimeoutName.String(c.t.Name),
		attrTimeoutID.String(c.t.ID.String()),
		attrTimeoutTries.Int(c.attempts+1),
	)
	return ctx, span
}

// endSpan ends a step's or timeout's span (nil when none was started),
// marking it failed by err.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, "saga step failed")
	}
	span.End()
}

// schedulingTrace is the trace context a timeout scheduled under ctx
// keeps, for its span to link to: the step's span when it records, else
// the handled event's own trace headers (an untraced step passes the
// cause's context on, as an untraced handler's appends do). Empty strings
// when there is neither; they are stored as NULL.
func schedulingTrace(ctx context.Context) (parent, state any) {
	var h map[string]string
	if tracing.Recorded(trace.SpanFromContext(ctx)) {
		h = tracing.Inject(ctx, nil)
	} else {
		h = projector.MetadataFrom(ctx).Headers
	}
	return nullable(h[tracing.HeaderTraceParent]), nullable(h[tracing.HeaderTraceState])
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

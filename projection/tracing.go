package projection

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// startBatchSpan starts the span of one batch of sh: a root span (a batch
// has many causes, none of them its parent) linked to the span that
// appended each event, up to [tracing.MaxLinks]. Handlers run under the
// returned context, so what they append (Emit) is a child of the batch.
//
// Nothing beyond starting a span is done when it does not record: with
// tracing off a batch costs no header parsing and no attributes. Links are
// therefore added after the start, and a sampler decides on the batch
// alone; the default parent-based sampler ignores links anyway. A replay
// (rebuild, in place or into shadow tables) links nothing: its events'
// traces ended long ago, and a link per replayed event would flood them.
func (d *Dispatcher) startBatchSpan(ctx context.Context, sh *shard, attempts int, events []projector.Event, replaying bool) (context.Context, trace.Span) {
	ctx, span := d.tracer.Start(ctx, sh.batchSpanName(), batchSpanOptions...)
	if !span.IsRecording() || len(events) == 0 {
		return ctx, span
	}
	dropped := 0
	if !replaying {
		linked := 0
		for _, ev := range events {
			sc := tracing.Extract(ev.Metadata.Headers)
			if !sc.IsValid() {
				continue
			}
			if linked == tracing.MaxLinks {
				dropped++
				continue
			}
			span.AddLink(trace.Link{SpanContext: sc})
			linked++
		}
	}
	span.SetAttributes(
		tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
		tracing.AttrMessagingOperationName.String("process"),
		tracing.AttrMessagingOperationType.String("process"),
		tracing.AttrMessagingConsumerGroup.String(sh.id.Consumer),
		tracing.AttrMessagingBatchCount.Int(len(events)),
		tracing.AttrConsumer.String(sh.id.Consumer),
		tracing.AttrInstance.String(sh.id.Instance),
		tracing.AttrPositionFirst.String(events[0].Position.String()),
		tracing.AttrPositionLast.String(events[len(events)-1].Position.String()),
		tracing.AttrAttempt.Int(attempts+1),
		tracing.AttrLinksDropped.Int(dropped),
		tracing.AttrReplay.Bool(replaying),
	)
	return ctx, span
}

// batchSpanOptions are the start options of every batch span, built once:
// built per batch, the option and its slice were two of the allocations a
// batch made with tracing off.
var batchSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// batchSpanName returns the name of sh's batch spans, built on first use
// and kept: a provider that records nothing never reads it, and building
// it per batch was an allocation tracing off paid. Only the shard's own
// loop calls it.
func (sh *shard) batchSpanName() string {
	if sh.spanName == "" {
		sh.spanName = "process " + sh.id.Consumer
	}
	return sh.spanName
}

// batchEventFailed marks the batch span failed by ev's handler error.
func batchEventFailed(span trace.Span, ev projector.Event, err error) {
	if !span.IsRecording() {
		return
	}
	span.RecordError(err, trace.WithAttributes(
		attribute.String("projector.event.id", ev.ID.String()),
		attribute.String("projector.event.type", ev.Type),
		attribute.String("projector.event.position", ev.Position.String()),
	))
	span.SetStatus(codes.Error, "handler failed")
}

// startEventSpan starts the child span of one event's handler call when
// Config.EventSpans asks for it and the batch span records, outside
// replays: a child of the batch span linked to the event's append. It
// returns a nil span otherwise, at the cost of a few comparisons.
func (d *Dispatcher) startEventSpan(ctx context.Context, sh *shard, ev *projector.Event) (context.Context, trace.Span) {
	if !d.cfg.EventSpans || !trace.SpanFromContext(ctx).IsRecording() || Replaying(ctx) {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if sc := tracing.Extract(ev.Metadata.Headers); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, span := d.tracer.Start(ctx, "process "+sh.id.Consumer+" "+ev.Type, opts...)
	span.SetAttributes(
		tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
		tracing.AttrMessagingOperationName.String("process"),
		tracing.AttrMessagingOperationType.String("process"),
		tracing.AttrMessagingConsumerGroup.String(sh.id.Consumer),
		tracing.AttrMessagingMessageID.String(ev.ID.String()),
		attribute.String("projector.event.type", ev.Type),
		attribute.String("projector.event.position", ev.Position.String()),
		tracing.AttrStreamTenant.String(ev.Stream.Tenant),
		tracing.AttrStreamType.String(ev.Stream.Type),
		tracing.AttrStreamID.String(ev.Stream.ID),
		tracing.AttrStreamVersion.Int64(ev.Version),
	)
	return ctx, span
}

// endEventSpan ends an event's span (nil when none was started), failed
// by the handler's err.
func endEventSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "handler failed")
	}
	span.End()
}

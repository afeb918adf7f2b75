package jetstream

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// startProcessSpan starts the span of one delivered message: a child of
// the span context in the message's traceparent header (the append that
// recorded the event, in another process), so the handler, which runs
// under the returned context, and everything it appends continue the
// producer's trace. A message without a valid traceparent starts a trace
// of its own; a malformed header is ignored, never an error.
func (c *Consumer) startProcessSpan(ctx context.Context, msg jetstream.Msg, deliveries uint64) (context.Context, trace.Span) {
	h := msg.Headers()
	if tp := h.Get(HeaderTraceParent); tp != "" {
		sc := tracing.Extract(map[string]string{HeaderTraceParent: tp, HeaderTraceState: h.Get(HeaderTraceState)})
		if sc.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			c.logger.Debug("jetstream consumer: malformed traceparent header ignored", "subscription", c.cfg.Subscription,
				"subject", msg.Subject(), "traceparent", projector.Printable(tp))
		}
	}
	ctx, span := c.tracer.Start(ctx, "process "+c.cfg.Subscription, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			tracing.AttrMessagingSystem.String(tracing.MessagingSystemNATS),
			tracing.AttrMessagingOperationName.String("process"),
			tracing.AttrMessagingOperationType.String("process"),
			tracing.AttrMessagingDestination.String(msg.Subject()),
			tracing.AttrMessagingSubscription.String(c.cfg.Subscription),
			tracing.AttrMessagingConsumerGroup.String(c.cfg.Subscription),
			tracing.AttrDeliveries.Int64(int64(min(deliveries, 1<<62))),
		)
	}
	return ctx, span
}

// endProcessSpan records the message's outcome on span and ends it; an
// error (the message left for redelivery) or a retried handler failure
// marks it failed.
func endProcessSpan(span trace.Span, outcome Outcome, err error) {
	if span.IsRecording() {
		if outcome != "" {
			span.SetAttributes(tracing.AttrOutcome.String(string(outcome)))
		}
		switch {
		case err != nil:
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		case outcome == Retried || outcome == DeadLettered:
			span.SetStatus(codes.Error, "handler failed: "+string(outcome))
		}
	}
	span.End()
}

package tracing

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every tracer Projector asks a
// TracerProvider for.
const ScopeName = "github.com/projectorhq/projector"

// The event headers that carry a span context (W3C Trace Context).
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// MaxLinks caps the links of one batch span: a batch of thousands of
// events would otherwise make a span nobody can read and a backend may
// refuse. The number left out is recorded as [AttrLinksDropped].
const MaxLinks = 128

// MessagingSystem is the value of messaging.system on Projector's spans
// of its own log (append, dispatcher batches).
const MessagingSystem = "projector"

// MessagingSystemNATS is the value of messaging.system on the spans of the
// JetStream relay and the claims consumer.
const MessagingSystemNATS = "nats"

// Attribute keys. The messaging.* keys follow the OpenTelemetry messaging
// semantic conventions; projector.* keys are Projector's own.
const (
	AttrMessagingSystem        = attribute.Key("messaging.system")
	AttrMessagingOperationName = attribute.Key("messaging.operation.name")
	AttrMessagingOperationType = attribute.Key("messaging.operation.type")
	AttrMessagingDestination   = attribute.Key("messaging.destination.name")
	AttrMessagingConsumerGroup = attribute.Key("messaging.consumer.group.name")
	AttrMessagingBatchCount    = attribute.Key("messaging.batch.message_count")
	AttrMessagingMessageID     = attribute.Key("messaging.message.id")
	AttrMessagingSubscription  = attribute.Key("messaging.destination.subscription.name")

	AttrStreamTenant    = attribute.Key("projector.stream.tenant")
	AttrStreamType      = attribute.Key("projector.stream.type")
	AttrStreamID        = attribute.Key("projector.stream.id")
	AttrExpectedVersion = attribute.Key("projector.expected_version")
	AttrStreamVersion   = attribute.Key("projector.stream.version")
	AttrConsumer        = attribute.Key("projector.consumer")
	AttrInstance        = attribute.Key("projector.instance")
	AttrPositionFirst   = attribute.Key("projector.position.first")
	AttrPositionLast    = attribute.Key("projector.position.last")
	AttrAttempt         = attribute.Key("projector.attempt")
	AttrLinksDropped    = attribute.Key("projector.links.dropped")
	AttrReplay          = attribute.Key("projector.replay")
	AttrOutcome         = attribute.Key("projector.outcome")
	AttrDeliveries      = attribute.Key("projector.deliveries")
)

// traceContext is the W3C propagator; it has no state.
var traceContext propagation.TraceContext

// Recorded reports whether span's context is worth writing into an event:
// valid, and sampled or recording. Leaving out an unsampled trace loses
// nothing a backend would have kept.
func Recorded(span trace.Span) bool {
	sc := span.SpanContext()
	return sc.IsValid() && (sc.IsSampled() || span.IsRecording())
}

// Inject writes the span context of ctx into headers as traceparent and
// tracestate, replacing any that were there (a handler's context carries
// the handled event's headers, whose trace context is the cause's, not
// this append's), and returns headers, allocated if nil.
func Inject(ctx context.Context, headers map[string]string) map[string]string {
	if headers == nil {
		headers = make(map[string]string, 2)
	}
	delete(headers, HeaderTraceParent)
	delete(headers, HeaderTraceState)
	traceContext.Inject(ctx, propagation.MapCarrier(headers))
	return headers
}

// Extract returns the span context stored in headers. A missing, malformed
// or oversized traceparent gives an invalid span context, never an error:
// a broken header must not stop an event from being handled.
func Extract(headers map[string]string) trace.SpanContext {
	if headers[HeaderTraceParent] == "" {
		return trace.SpanContext{}
	}
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier(headers))
	return trace.SpanContextFromContext(ctx)
}

// Tracer returns Projector's tracer from tp, the global provider when nil.
// The global provider forwards to whatever SDK the application installs
// later, so taking it at construction loses nothing.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

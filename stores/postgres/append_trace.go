package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// appendTraced is Append inside an append span, a child of the caller's:
// the span whose context the events record, so the handlers they reach
// link back to this append (and, through it, to the caller's request).
func (s *Store) appendTraced(ctx context.Context, tx pgx.Tx, stream projector.StreamRef, expected projector.ExpectedVersion, payloads []any) (AppendResult, error) {
	// The stream's names go out through Printable: they reach an exporter
	// before the append has validated them.
	streamType := projector.Printable(stream.Type)
	ctx, span := s.tracer.Start(ctx, "append "+streamType,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			tracing.AttrMessagingSystem.String(tracing.MessagingSystem),
			tracing.AttrMessagingOperationName.String("append"),
			tracing.AttrMessagingOperationType.String("send"),
			tracing.AttrMessagingDestination.String(streamType),
			tracing.AttrMessagingBatchCount.Int(len(payloads)),
			tracing.AttrStreamTenant.String(projector.Printable(stream.Tenant)),
			tracing.AttrStreamType.String(streamType),
			tracing.AttrStreamID.String(projector.Printable(stream.ID)),
			tracing.AttrExpectedVersion.Int64(int64(expected)),
		))
	defer span.End()
	res, err := s.appendEvents(ctx, tx, stream, expected, payloads, true)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "append failed")
		return AppendResult{}, fmt.Errorf("append to stream %s: %w", stream, err)
	}
	span.SetAttributes(tracing.AttrStreamVersion.Int64(res.Version))
	return res, nil
}

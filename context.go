package projector

import (
	"context"
	"maps"

	"github.com/google/uuid"
)

type ctxKey int

const (
	correlationKey ctxKey = iota
	causationKey
	actorKey
	headersKey
)

// WithCorrelationID returns a context whose appends carry id as their
// correlation id. Set it once where a request or command enters the system.
func WithCorrelationID(ctx context.Context, id uuid.UUID) context.Context {
	return context.WithValue(ctx, correlationKey, id)
}

// WithCausationID returns a context whose appends record id as the event that
// caused them. The dispatcher sets it to the handled event's id, so handlers
// rarely need to call it themselves.
func WithCausationID(ctx context.Context, id uuid.UUID) context.Context {
	return context.WithValue(ctx, causationKey, id)
}

// WithActor returns a context whose appends record actor (a user id, a
// service name) as who caused them.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey, actor)
}

// WithHeader returns a context whose appends carry the header key=value in
// addition to any headers already in ctx.
func WithHeader(ctx context.Context, key, value string) context.Context {
	old, _ := ctx.Value(headersKey).(map[string]string)
	h := make(map[string]string, len(old)+1)
	maps.Copy(h, old)
	h[key] = value
	return context.WithValue(ctx, headersKey, h)
}

// WithMetadata returns a context carrying every field of md: the way a
// handler continues the correlation of the event it handles.
func WithMetadata(ctx context.Context, md Metadata) context.Context {
	if md.CorrelationID != uuid.Nil {
		ctx = WithCorrelationID(ctx, md.CorrelationID)
	}
	if md.CausationID != uuid.Nil {
		ctx = WithCausationID(ctx, md.CausationID)
	}
	if md.Actor != "" {
		ctx = WithActor(ctx, md.Actor)
	}
	for k, v := range md.Headers {
		ctx = WithHeader(ctx, k, v)
	}
	return ctx
}

// MetadataFrom returns the metadata held by ctx. The correlation id is
// uuid.Nil when none was set; the store then starts a new correlation.
func MetadataFrom(ctx context.Context) Metadata {
	md := Metadata{}
	md.CorrelationID, _ = ctx.Value(correlationKey).(uuid.UUID)
	md.CausationID, _ = ctx.Value(causationKey).(uuid.UUID)
	md.Actor, _ = ctx.Value(actorKey).(string)
	if h, ok := ctx.Value(headersKey).(map[string]string); ok {
		md.Headers = maps.Clone(h)
	}
	return md
}

package projector_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

func TestMetadataFromContext(t *testing.T) {
	t.Parallel()
	corr, cause := uuid.New(), uuid.New()
	ctx := projector.WithCorrelationID(context.Background(), corr)
	ctx = projector.WithCausationID(ctx, cause)
	ctx = projector.WithActor(ctx, "alice")
	base := projector.WithHeader(ctx, "a", "1")
	child := projector.WithHeader(base, "b", "2")

	md := projector.MetadataFrom(child)
	if md.CorrelationID != corr || md.CausationID != cause || md.Actor != "alice" || md.Headers["a"] != "1" || md.Headers["b"] != "2" {
		t.Fatalf("metadata %+v", md)
	}
	if _, leaked := projector.MetadataFrom(base).Headers["b"]; leaked {
		t.Fatal("a header added to a child context leaked into its parent")
	}
	md.Headers["a"] = "changed"
	if projector.MetadataFrom(child).Headers["a"] != "1" {
		t.Fatal("MetadataFrom returned the context's own map")
	}
	again := projector.MetadataFrom(projector.WithMetadata(context.Background(), projector.MetadataFrom(child)))
	if again.CorrelationID != corr || again.Headers["b"] != "2" {
		t.Fatalf("WithMetadata round trip: %+v", again)
	}
	if projector.MetadataFrom(context.Background()).CorrelationID != uuid.Nil {
		t.Fatal("empty context has a correlation id")
	}
}

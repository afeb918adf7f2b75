package jetstream_test

import (
	"context"
	"strings"
	"testing"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A retry whose handler fails for a reason that is not about the event
// (its table is gone: SQLSTATE 42P01) returns that failure, IsSystemic,
// with nothing recorded on the dead letter; before, it was recorded as the
// event failing again. Once the table is back the same retry resolves it.
func TestDeadLetterRetryWithASystemicHandlerFailureRecordsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	snk := newSink(t, testevents.New().Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := snk.deadLetter(t, "feed", "t1")
	before := snk.status(t, "feed", id)
	if _, err := snk.store.Pool().Exec(ctx, `ALTER TABLE `+snk.effects+` RENAME TO effects_gone`); err != nil {
		t.Fatal(err)
	}
	err = c.RetryDeadLetter(ctx, id)
	if err == nil || !projection.IsSystemic(err) || !strings.Contains(err.Error(), "nothing recorded") {
		t.Fatalf("retry: %v; want a systemic error with nothing recorded", err)
	}
	if d := snk.status(t, "feed", id); d.Status != projection.DeadLetterOpen || d.Error != before.Error || d.LastRetriedAt != nil {
		t.Fatalf("after the retry: %+v; want it as before: %+v", d, before)
	}
	if _, err := snk.store.Pool().Exec(ctx, `ALTER TABLE `+snk.store.Table("effects_gone")+` RENAME TO effects`); err != nil {
		t.Fatal(err)
	}
	if err := c.RetryDeadLetter(ctx, id); err != nil {
		t.Fatal(err)
	}
	if d := snk.status(t, "feed", id); d.Status != projection.DeadLetterResolved {
		t.Fatalf("after the retry with the table back: %+v", d)
	}
}

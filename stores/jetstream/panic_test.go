package jetstream_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// panickingConsumer is subscription's claims consumer with a handler that
// writes its effect and then panics on every event.
func panickingConsumer(t *testing.T, snk *sink, subscription string) *pjs.Consumer {
	t.Helper()
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: subscription, ErrorMode: pjs.ParkStream,
		Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if err := snk.record(ctx, tx, ev); err != nil {
				return err
			}
			panic("handler panicked on purpose")
		}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A park retried through a handler that panics fails like one whose
// handler returns an error: the panic is an error, the park stays open
// with its whole sequence, the error recorded and one more failure, and
// nothing of the retry is applied.
func TestJetStreamParkRetryOfAPanickingHandler(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	c := panickingConsumer(t, snk, "feed")
	id, evs := snk.parkOf(t, "feed", projector.TenantStream("acme", "ticket", "p"), 2, 4)
	n, err := c.RetryPark(context.Background(), id, "alice")
	var failed *pjs.ParkRetryFailedError
	if !errors.As(err, &failed) || n != 0 || !strings.Contains(err.Error(), "panicked on purpose") || failed.Version != 2 {
		t.Fatalf("retry through a panicking handler: %d, %v; want a ParkRetryFailedError on v2 carrying the panic", n, err)
	}
	p, msgs, err := pjs.GetPark(context.Background(), snk.store, "feed", id)
	if err != nil || p.Status != projection.ParkOpen || len(msgs) != 3 || p.Failures != 6 || !strings.Contains(p.Error, "panicked on purpose") {
		t.Fatalf("after the panicking retry: %+v with %d messages, %v; want it open, 3 messages, 6 failures, the panic recorded", p, len(msgs), err)
	}
	for _, ev := range evs {
		if k := snk.effectsOf(t, ev); k != 0 {
			t.Fatalf("the panicking retry left %d effects of v%d", k, ev.Version)
		}
	}
}

// The same for a dead letter: kept open with the panic as its error.
func TestJetStreamDeadLetterRetryOfAPanickingHandler(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	c := panickingConsumer(t, snk, "feed")
	id, ev := snk.deadLetter(t, "feed", "p")
	err := c.RetryDeadLetter(context.Background(), id)
	var failed *pjs.RetryFailedError
	if !errors.As(err, &failed) || !strings.Contains(err.Error(), "panicked on purpose") {
		t.Fatalf("retry through a panicking handler: %v; want a RetryFailedError carrying the panic", err)
	}
	dl := snk.status(t, "feed", id)
	if dl.Status != projection.DeadLetterOpen || !strings.Contains(dl.Error, "panicked on purpose") || dl.LastRetriedAt == nil {
		t.Fatalf("after the panicking retry: %+v; want it open with the panic recorded", dl)
	}
	if k := snk.effectsOf(t, ev); k != 0 {
		t.Fatalf("the panicking retry left %d effects", k)
	}
}

// A live message whose handler panics fails like one whose handler returns
// an error: counted, and after MaxDeliver failures its stream is parked
// with the panic as the error, while the consumer keeps applying the other
// streams (before, the panic took the process down).
func TestConsumerPanickingHandlerParksTheStream(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	e.append("acme", "p", testevents.TicketCommented{Body: "fine", N: 0}, testevents.TicketCommented{Body: "panic", N: 1})
	e.append("acme", "q", testevents.TicketCommented{Body: "fine", N: 0}, testevents.TicketCommented{Body: "fine", N: 1})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "parking", MaxDeliver: 2, ErrorMode: pjs.ParkStream,
		Backoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HoldDelay: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if ev.Payload.(testevents.TicketCommented).Body == "panic" {
				panic("handler panicked on purpose")
			}
			return snk.record(ctx, tx, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("parking"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "q applied and p parked at v2", 30*time.Second, func() bool { return snk.count(t) == 3 && snk.parkedCount(t, "parking") == 1 })
	parks := openParks(t, snk.store, "parking")
	if len(parks) != 1 || parks[0].StreamID != "p" || parks[0].Version != 2 || parks[0].Failures != 2 ||
		!strings.Contains(parks[0].Error, "panic in handler: handler panicked on purpose") {
		t.Fatalf("parks %+v; want p parked at v2 after 2 failures with the panic as its error", parks)
	}
}

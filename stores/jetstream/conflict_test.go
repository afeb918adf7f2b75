package jetstream_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A delivered message whose handler loses a conflict with another
// transaction (here a real deadlock's victim) is not the event's failure:
// nothing is counted against it and it comes back. With MaxDeliver 1 it
// used to be dead-lettered at once, a healthy event. The deadlock: the
// test holds the handler's table in SHARE mode, so the consumer, holding
// its stream's row (the order check), waits at the handler's INSERT; the
// test then asks for that row with a far longer deadlock_timeout, so the
// consumer's backend finds the cycle and is aborted.
func TestHandlerLosingADeadlockIsNotCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "conflicted", Handler: snk.record, MaxDeliver: 1,
		Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stream := projector.TenantStream("acme", "ticket", "c1")
	evs := comments(stream, 2)
	cons := e.jsConsumer("conflicted")
	next := func() jetstream.Msg {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := <-batch.Messages()
		if !ok {
			t.Fatal("no message delivered")
		}
		return msg
	}
	// The first event makes the stream's row the order check locks.
	e.publish(r, evs[0])
	if o, err := c.Handle(e.ctx, next()); err != nil || o != pjs.Applied {
		t.Fatalf("v1: %s, %v; want applied", o, err)
	}
	e.publish(r, evs[1])
	msg := next()

	tx, _ := pgtest.HoldForDeadlock(t, snk.store.Pool(), snk.effects)
	type handled struct {
		o   pjs.Outcome
		err error
	}
	done := make(chan handled, 1)
	go func() {
		o, err := c.Handle(e.ctx, msg)
		done <- handled{o, err}
	}()
	pgtest.WaitForLockOn(t, pgtest.Pool(t), snk.effects) // the consumer holds the stream's row and waits at the INSERT
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+snk.store.Table("projector_jetstream_streams")+` WHERE subscription = 'conflicted' AND stream_id = $1 FOR UPDATE`,
		stream.ID); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the consumer aborted", err)
	}
	var h handled
	select {
	case h = <-done:
	case <-time.After(time.Minute):
		// The old code dead-lettered the event here, which waits for the
		// stream's row the test holds.
		t.Fatal("the deadlocked delivery did not return within a minute; want it left for redelivery at once")
	}
	if h.err != nil || h.o != pjs.Retried {
		t.Fatalf("the deadlocked delivery: %s, %v; want retried, no error", h.o, h.err)
	}
	dls, err := pjs.ListDeadLetters(e.ctx, snk.store, "conflicted", 10)
	if err != nil {
		t.Fatal(err)
	}
	var failures int
	if err := snk.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+snk.store.Table("projector_jetstream_failures")+` WHERE subscription = 'conflicted'`).Scan(&failures); err != nil {
		t.Fatal(err)
	}
	if len(dls) != 0 || failures != 0 {
		t.Fatalf("after the deadlock: %d dead letters %+v, %d failures counted; want none", len(dls), dls, failures)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	// It comes back, and goes through.
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	for snk.effectsOf(t, evs[1]) == 0 && ctx.Err() == nil {
		if o, err := c.Handle(ctx, next()); err != nil {
			t.Fatalf("redelivery: %s, %v", o, err)
		}
	}
	snk.check(t, evs)
}

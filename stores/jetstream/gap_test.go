package jetstream_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A real gap made by hand: version 3 of a relayed stream is deleted from
// JetStream, so versions 4 to 6 are held behind it, delivered again and
// again in whatever order. The gap record names the first missing version
// (3) and the held range (4..6) however the holds interleave; SkipTo past a
// held version is refused (it would pass held events that were never
// applied nor dead-lettered), SkipTo to the first held one is accepted,
// and then every held event is applied once, in order.
func TestConsumerGapNamesFirstMissingAndHeldRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	for i := range 6 {
		e.append("acme", "gap", testevents.TicketCommented{Body: "x", N: i})
	}
	catchUpOnce(t, e, r)
	log := e.logEvents()
	stream := log[0].Stream

	// Delete version 3 from the stream: it will never be delivered.
	s, err := r.JetStream().Stream(e.ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := e.streamMsgs(e.nc)
	if len(msgs) != 6 {
		t.Fatalf("%d messages, want 6", len(msgs))
	}
	if err := s.DeleteMsg(e.ctx, msgs[2].Sequence); err != nil {
		t.Fatal(err)
	}

	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "gappy", Handler: snk.record,
		HoldDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("gappy"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	gap := func() pjs.Gap {
		t.Helper()
		gaps, err := pjs.Gaps(e.ctx, snk.store, "gappy")
		if err != nil {
			t.Fatal(err)
		}
		if len(gaps) != 1 {
			return pjs.Gap{}
		}
		return gaps[0]
	}
	waitFor(t, "versions 4 to 6 held behind 3", 30*time.Second, func() bool {
		g := gap()
		return snk.count(t) == 2 && g.HeldFrom == 4 && g.HeldTo == 6
	})
	// Read it many times while the held messages keep coming back: it
	// never names anything but the first missing version and the range.
	for range 20 {
		g := gap()
		if g.Stream != stream || g.LastVersion != 2 || g.FirstMissing != 3 || g.HeldFrom != 4 || g.HeldTo != 6 || g.HeldSince.IsZero() {
			t.Fatalf("gap %+v: want last 2, first missing 3, held 4..6 of %s", g, stream)
		}
		time.Sleep(5 * time.Millisecond) // spacing the reads among the redeliveries, not synchronisation
	}
	for _, v := range []int64{5, 6, 7} {
		if err := pjs.SkipTo(e.ctx, snk.store, "gappy", stream, v); !errors.Is(err, projector.ErrInvalidTransition) {
			t.Fatalf("SkipTo(%d) past held version 4: %v, want ErrInvalidTransition", v, err)
		}
	}
	if err := pjs.SkipTo(e.ctx, snk.store, "gappy", stream, 4); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held events applied", 30*time.Second, func() bool { return snk.count(t) == 5 })
	snk.check(t, []projector.Event{log[0], log[1], log[3], log[4], log[5]})
	if g := gap(); g != (pjs.Gap{}) {
		t.Fatalf("gap %+v after the held events were applied, want none", g)
	}
	if err := pjs.SkipTo(e.ctx, snk.store, "gappy", stream, 8); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("SkipTo with nothing held: %v, want ErrInvalidTransition", err)
	}
}

// MaxDeliver counts the handler's failures, not NATS deliveries: a message
// held four times behind its predecessor (each hold a delivery) and then
// failing once is retried, not dead-lettered; it is dead-lettered only
// when its handler failed MaxDeliver times.
func TestConsumerMaxDeliverCountsHandlerFailuresOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	var failV2 atomic.Int32 // failures left for version 2
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "counted", MaxDeliver: 3,
		Backoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond, HoldDelay: 10 * time.Millisecond,
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if ev.Stream.ID == "poison" || ev.Version == 2 && failV2.Add(-1) >= 0 {
				return errors.New("serialization failure")
			}
			return snk.record(ctx, tx, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	stream := projector.TenantStream("acme", "ticket", "m1")
	evs := comments(stream, 2)
	publish := func(ev projector.Event) { e.publish(r, ev) }
	cons := e.jsConsumer("counted")
	next := func() (pjs.Outcome, uint64) {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := <-batch.Messages()
		if !ok {
			t.Fatal("no message delivered")
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		o, err := c.Handle(e.ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return o, md.NumDelivered
	}
	publish(evs[1])
	for i := range 4 {
		if o, _ := next(); o != pjs.Held {
			t.Fatalf("delivery %d of version 2 before 1: %s, want held", i+1, o)
		}
	}
	publish(evs[0])
	failV2.Store(1)
	seen := map[pjs.Outcome]int{}
	for snk.count(t) < 2 {
		o, n := next()
		seen[o]++
		if o == pjs.DeadLettered {
			t.Fatalf("version 2 dead-lettered at delivery %d after one handler failure (MaxDeliver 3 counts failures)", n)
		}
	}
	if seen[pjs.Retried] != 1 || seen[pjs.Applied] != 2 {
		t.Fatalf("outcomes %v: want one retry and two applied", seen)
	}
	snk.check(t, evs)

	// Three failures of one event do dead-letter it.
	poison := projector.Event{ID: uuidFor(2), Stream: projector.TenantStream("acme", "ticket", "poison"), Version: 1, Type: "ticket.commented",
		SchemaVersion: 1, Data: []byte(`{"body":"b","n":2}`), Position: projector.Position{TxID: 10, Seq: 3}, RecordedAt: time.Now()}
	publish(poison)
	for i := 1; i <= 3; i++ {
		want := pjs.Retried
		if i == 3 {
			want = pjs.DeadLettered
		}
		if o, _ := next(); o != want {
			t.Fatalf("failure %d of the poison event: %s, want %s", i, o, want)
		}
	}
}

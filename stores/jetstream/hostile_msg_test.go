package jetstream_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A message PostgreSQL could not store as it came (a header holding a NUL,
// which jsonb refuses; a subject that is not UTF-8) is dead-lettered once,
// recorded with U+FFFD in place, and acknowledged: its dead letter failed to
// write, so it was never acknowledged and came back every AckWait (a relay
// and saga audit).
func TestConsumerDeadLettersUnstorableMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "hostile", Handler: snk.record, MaxDeliver: 1,
		Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*nats.Msg{
		{Subject: e.prefix + ".x", Header: nats.Header{"X-Nul": []string{"a\x00b"}}, Data: []byte("{}")},
		{Subject: e.prefix + ".\xff\xfe", Data: []byte("{}")},
	} {
		if _, err := js.PublishMsg(e.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cons := e.jsConsumer("hostile")
	for i := range 2 {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("message %d not delivered", i)
		}
		if o, err := c.Handle(e.ctx, msg); err != nil || o != pjs.DeadLettered {
			t.Fatalf("message %d: %s, %v; want dead-lettered", i, o, err)
		}
	}
	dls, err := pjs.ListDeadLetters(e.ctx, snk.store, "hostile", 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters: %+v, %v; want both messages", dls, err)
	}
}

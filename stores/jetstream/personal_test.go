package jetstream_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestRelaySendsNoPersonalFields: the relay publishes an event with
// personal fields with those fields null and the redaction header, so
// JetStream, which cannot forget, never holds them, clear or sealed; the
// other fields arrive intact and the message decodes.
func TestRelaySendsNoPersonalFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("relay", testevents.MasterKey("relay"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	nc := connect(t, natsURL())
	id := randomHex(6)
	stream, prefix := "T_"+id, "t"+id
	t.Cleanup(func() {
		if js, err := jetstream.New(nc); err == nil {
			_ = js.DeleteStream(context.Background(), stream)
		}
	})
	r, err := pjs.NewRelay(pjs.RelayConfig{Conn: nc, Registry: types.Registry, Stream: stream, Prefix: prefix, PublishTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c-1", "c-2"} {
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", c), projector.NoStream,
				testevents.CustomerRegistered{Customer: c, Name: "Ada " + c, Email: c + "@example.com", Plan: "pro"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{r.Async()}, PollMax: 50 * time.Millisecond,
		Recheck: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(sctx)
	}()
	e := &env{t: t, ctx: ctx, store: store, nc: nc, stream: stream, prefix: prefix}
	var msgs []*jetstream.RawStreamMsg
	waitFor(t, "two messages", 30*time.Second, func() bool { msgs = e.streamMsgs(nc); return len(msgs) == 2 })
	for _, m := range msgs {
		body := string(m.Data)
		if strings.Contains(body, "Ada") || strings.Contains(body, "@example.com") || strings.Contains(body, "pjx1.") {
			t.Fatalf("a JetStream message holds a personal field, clear or sealed: %s", body)
		}
		if !strings.Contains(body, `"plan": "pro"`) || m.Header.Get(pjs.HeaderPersonalRedacted) != "true" {
			t.Fatalf("message %s, headers %v", body, m.Header)
		}
		ev, err := pjs.Decode(types.Registry, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if c := ev.Payload.(testevents.CustomerRegistered); c.Name != "" || c.Email != "" || c.Plan != "pro" || c.Customer == "" {
			t.Fatalf("decoded %+v", c)
		}
	}
}

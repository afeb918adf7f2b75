package jetstream_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// The relay runs in a dispatcher like any async projection. (Compiled, not
// run: it needs a NATS server and a database; docs/jetstream.md shows the same.)
func ExampleNewRelay() {
	ctx := context.Background()
	var store *postgres.Store // from postgres.New, migrated
	run := func() error {
		nc, err := nats.Connect(cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), nats.MaxReconnects(-1), nats.RetryOnFailedConnect(true))
		if err != nil {
			return fmt.Errorf("connect to NATS: %w", err)
		}
		relay, err := jetstream.NewRelay(jetstream.RelayConfig{Conn: nc, Registry: store.Registry()})
		if err != nil {
			return err
		}
		if _, err := relay.Ensure(ctx); err != nil {
			return err
		}
		d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{relay.Async()}})
		if err != nil {
			return err
		}
		return d.Start(ctx)
	}
	_ = run
}

// A service on the other side applies the events with claims: each
// event's effects once, per stream in version order.
func ExampleNewConsumer() {
	ctx := context.Background()
	var store *postgres.Store // the consumer's own database, migrated
	var js natsjs.JetStream
	var reg prometheus.Registerer // the service's metrics registry (nil for none)
	run := func() (natsjs.ConsumeContext, error) {
		cons, err := js.CreateOrUpdateConsumer(ctx, "PROJECTOR", natsjs.ConsumerConfig{
			Durable: "billing", FilterSubject: "projector.*.ticket.>",
			AckPolicy: natsjs.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
		})
		if err != nil {
			return nil, err
		}
		c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{
			Store:        store,
			Subscription: "billing",
			Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				_, err := tx.Exec(ctx, `INSERT INTO billing_log (event_id, type) VALUES ($1, $2)`, ev.ID, ev.Type)
				return err
			},
			Registerer: reg, // projector_jetstream_dead_letters_open{subscription="billing"}
		})
		if err != nil {
			return nil, err
		}
		return c.Consume(ctx, cons)
	}
	_ = run
}

// Once a dead letter's cause is fixed, a retry applies it and marks it
// resolved in one transaction; the row stays as the record. (Compiled, not
// run; docs/jetstream.md shows the same.)
func ExampleConsumer_RetryDeadLetter() {
	ctx := context.Background()
	var consumer *jetstream.Consumer // from jetstream.NewConsumer
	run := func() error {
		err := consumer.RetryDeadLetter(ctx, 42)
		switch {
		case errors.Is(err, jetstream.ErrDeadLetterNotOpen):
			// resolved or discarded already: nothing was applied again
		case errors.Is(err, projector.ErrNotFound):
			// no dead letter 42 of this subscription
		case err != nil:
			return err // the handler failed again; the dead letter stays open with the error
		}
		return nil
	}
	_ = run
}

// A subscription's dead letters are kept after a retry or a discard, so its
// record is read in pages: the last id of one page is the AfterID of the
// next. (Compiled, not run; docs/jetstream.md shows the same.)
func ExampleListDeadLettersMatching() {
	ctx := context.Background()
	var store *postgres.Store // the consumer's own database
	run := func() error {
		f := jetstream.DeadLetterFilter{Subscription: "billing", Status: "", Limit: 500} // "" for every status
		for {
			page, err := jetstream.ListDeadLettersMatching(ctx, store, f)
			if err != nil {
				return err
			}
			if len(page) == 0 {
				return nil
			}
			for _, d := range page {
				fmt.Println(d.ID, d.Status, d.Subject, d.Error)
			}
			f.AfterID = page[len(page)-1].ID
		}
	}
	_ = run
}

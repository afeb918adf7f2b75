// Package ticketfeed is a small service on the other side of the relay: it
// consumes the helpdesk's ticket events from NATS JetStream and keeps its
// own table of counts per event type, with exactly-once effects through the
// claims consumer of stores/jetstream. It uses no helpdesk code: only the
// event type names and payload shapes it cares about, defined in its own
// registry, as a service in another repository would.
package ticketfeed

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

type (
	opened    map[string]any
	assigned  map[string]any
	commented map[string]any
	closed    map[string]any
	escalated map[string]any
)

func define[T any](reg *projector.Registry, name string) error {
	_, err := projector.Define[T](reg, name)
	return err
}

// Subscription is the feed's claims key and durable JetStream consumer.
const Subscription = "ticketfeed"

// Feed is the running feed.
type Feed struct {
	Store *postgres.Store
	table string
	cc    natsjs.ConsumeContext
}

// Start migrates schema (the feed's own Projector schema, which holds its
// claims) and its counts table, then consumes stream's ticket events
// (subjects <prefix>.*.ticket.>). Stop it with [Feed.Stop].
func Start(ctx context.Context, pool *pgxpool.Pool, js natsjs.JetStream, schema, stream, prefix string) (*Feed, error) {
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		return nil, err
	}
	reg, err := Registry()
	if err != nil {
		return nil, err
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		return nil, err
	}
	f := &Feed{Store: store, table: store.Table("ticketfeed_counts")}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+f.table+` (event_type text PRIMARY KEY, events bigint NOT NULL)`); err != nil {
		return nil, fmt.Errorf("ticketfeed: create table: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, natsjs.ConsumerConfig{
		Durable: Subscription, FilterSubject: prefix + ".*.ticket.>",
		AckPolicy: natsjs.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
	})
	if err != nil {
		return nil, fmt.Errorf("ticketfeed: create consumer: %w", err)
	}
	c, err := NewConsumer(store)
	if err != nil {
		return nil, err
	}
	if f.cc, err = c.Consume(ctx, cons); err != nil {
		return nil, fmt.Errorf("ticketfeed: consume: %w", err)
	}
	return f, nil
}

// Registry returns the feed's event types. The feed counts ticket events
// without looking inside them, so it defines the names with loose payload
// types of its own (a registry maps each Go type to one event type).
func Registry() (*projector.Registry, error) {
	reg := projector.NewRegistry()
	for _, err := range []error{
		define[opened](reg, "ticket.opened"), define[assigned](reg, "ticket.assigned"),
		define[commented](reg, "ticket.commented"), define[closed](reg, "ticket.closed"),
		define[escalated](reg, "ticket.escalated"),
	} {
		if err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// NewConsumer returns the feed's claims consumer on store (the feed's own
// schema): what Start runs, and what the ops binary (cmd/ticketfeed-ops)
// hands cli.Config.JetStreamConsumers so `relay dead-letters retry` can
// run the feed's handler.
func NewConsumer(store *postgres.Store) (*jetstream.Consumer, error) {
	table := store.Table("ticketfeed_counts")
	return jetstream.NewConsumer(jetstream.ConsumerConfig{
		Store: store, Subscription: Subscription,
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (event_type, events) VALUES ($1, 1)
				ON CONFLICT (event_type) DO UPDATE SET events = `+table+`.events + 1`, ev.Type)
			return err
		},
	})
}

// Stop stops consuming.
func (f *Feed) Stop() { f.cc.Stop() }

// Counts returns the events handled per type.
func (f *Feed) Counts(ctx context.Context) (map[string]int64, error) {
	rows, err := f.Store.Pool().Query(ctx, `SELECT event_type, events FROM `+f.table)
	if err != nil {
		return nil, fmt.Errorf("ticketfeed: counts: %w", err)
	}
	counts := map[string]int64{}
	var typ string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&typ, &n}, func() error { counts[typ] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("ticketfeed: counts: %w", err)
	}
	return counts, nil
}

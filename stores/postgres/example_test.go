package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

type TicketOpened struct {
	Customer string `json:"customer"`
	Subject  string `json:"subject"`
}

// Validate is optional; the store calls it before writing anything.
func (e TicketOpened) Validate() error {
	if e.Subject == "" {
		return errors.New("subject is required")
	}
	return nil
}

type TicketClosed struct {
	Resolution string `json:"resolution"`
}

// The whole of docs/getting-started.md: define the event types, migrate the
// schema, open the store, append inside a transaction, read a stream and
// follow the gap-safe log.
func Example() {
	ctx := context.Background()
	// An application reads these from its configuration:
	// os.Getenv("PROJECTOR_DATABASE_URL") and its schema ("projector").
	url, schema := pgtest.ExampleDatabase()

	// At start-up: every event type, once, in one registry.
	reg := projector.NewRegistry()
	if _, err := projector.Define[TicketOpened](reg, "ticket.opened"); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := projector.Define[TicketClosed](reg, "ticket.closed"); err != nil {
		fmt.Println(err)
		return
	}

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil { // or `projector migrate --schema ...`
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Per request: the events commit with the request's own writes.
	requestID := uuid.New() // in a server: the request's id, if it is a UUID
	ctx = projector.WithActor(ctx, "agent:alice")
	ctx = projector.WithCorrelationID(ctx, requestID)
	ticket := projector.Stream("ticket", "T-1")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... your own writes in tx ...
		_, err := store.Append(ctx, tx, ticket, projector.NoStream,
			TicketOpened{Customer: "ada", Subject: "printer on fire"}, TicketClosed{Resolution: "extinguished"})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Appending to a stream that already exists, as if it did not:
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, ticket, projector.NoStream, TicketOpened{Customer: "ada", Subject: "again"})
		return err
	})
	fmt.Println("second open:", errors.Is(err, projector.ErrConcurrency))

	events, err := store.ReadStream(ctx, ticket, postgres.StreamQuery{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, ev := range events {
		fmt.Printf("v%d %s %T actor=%s same request=%t\n", ev.Version, ev.Type, ev.Payload, ev.Metadata.Actor, ev.Metadata.CorrelationID == requestID)
	}

	// Follow the log: small batches here to show the loop. The read is
	// gap-safe: it returns only events of transactions older than every
	// transaction still running in the cluster, so a batch that is not
	// full means "caught up for now", and a follower waits, then reads
	// again from its cursor. (This one stops once it has seen both events.)
	follow, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cursor, seen := projector.Start, 0
	for seen < 2 {
		batch, err := store.ReadLog(follow, postgres.LogQuery{After: cursor, Limit: 1, EventTypes: []string{"ticket.opened", "ticket.closed"}})
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, ev := range batch.Events {
			fmt.Println("log:", ev.Stream, ev.Type)
		}
		seen += len(batch.Events)
		cursor = batch.Next(cursor)
		if !batch.Full && seen < 2 {
			select { // caught up for now: wait a little, then read again
			case <-follow.Done():
				fmt.Println(follow.Err())
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	// Output:
	// second open: true
	// v1 ticket.opened postgres_test.TicketOpened actor=agent:alice same request=true
	// v2 ticket.closed postgres_test.TicketClosed actor=agent:alice same request=true
	// log: __system__/ticket/T-1 ticket.opened
	// log: __system__/ticket/T-1 ticket.closed
}

package meilisearchtest_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/postgres"
)

type TicketOpened struct {
	Subject string `json:"subject"`
}

type TicketClosed struct{}

// TicketDoc is what the index holds per ticket.
type TicketDoc struct {
	ID      string `json:"id"`
	Subject string `json:"subject"`
	Status  string `json:"status"`
}

// A search projection on Meilisearch, tested without a Meilisearch server:
// the fake answers the backend as Meilisearch's HTTP API does, asynchronous
// tasks included. In a test function, meilisearchtest.New(t) starts it and
// stops it when the test ends, and meilisearchtest.Config(t) picks a real
// server instead when MEILISEARCH_URL is set.
func Example() {
	ctx := context.Background()
	fake, err := meilisearchtest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fake.Close()

	url, schema := pgtest.ExampleDatabase() // your test database and schema
	reg := projector.NewRegistry()
	ticketOpened, err := projector.Define[TicketOpened](reg, "ticket.opened")
	if err != nil {
		fmt.Println(err)
		return
	}
	ticketClosed, err := projector.Define[TicketClosed](reg, "ticket.closed")
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	backend, err := meilisearch.New(meilisearch.Config{URL: fake.URL(), PollInterval: 5 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	tickets := search.New("ticket_search", search.Config{
		Index:   search.Index{Name: "tickets", Searchable: []string{"subject"}, Filterable: []string{"status"}},
		Backend: backend,
	})
	err = search.On(tickets, ticketOpened, func(ctx context.Context, ev projector.Event, e TicketOpened, w *search.Writer) error {
		return w.Upsert(TicketDoc{ID: ev.Stream.ID, Subject: e.Subject, Status: "open"})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = search.On(tickets, ticketClosed, func(ctx context.Context, ev projector.Event, _ TicketClosed, w *search.Writer) error {
		return w.Patch(ev.Stream.ID, map[string]string{"status": "closed"})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tickets.Ensure(ctx); err != nil { // creates the index on the fake
		fmt.Println(err)
		return
	}
	async, err := tickets.Async()
	if err != nil {
		fmt.Println(err)
		return
	}

	// Given these events…
	for _, t := range []struct {
		id, subject string
		closed      bool
	}{{"T-1", "Printer on fire", false}, {"T-2", "Printer out of paper", true}, {"T-3", "VPN down", false}} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			payloads := []any{TicketOpened{Subject: t.subject}}
			if t.closed {
				payloads = append(payloads, TicketClosed{})
			}
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "ticket", t.id), projector.NoStream, payloads...)
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	// …run the projection until it has caught up with the log…
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{async}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := d.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = d.Stop(ctx) }()
	if err := d.CatchUp(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// …and expect these documents: through a search, and in the fake.
	docs, err := search.Search[TicketDoc](search.WithTenant(ctx, "acme"), tickets, "print", search.Eq("status", "open"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, doc := range docs {
		fmt.Printf("%s %q %s\n", doc.ID, doc.Subject, doc.Status)
	}
	_, n := fake.Index(backend.UID(search.Index{Name: "tickets"}))
	fmt.Println(n, "documents indexed")
	// Output:
	// T-1 "Printer on fire" open
	// 3 documents indexed
}

// Package search keeps search indexes up to date from the event log: a
// search projection maps typed events to operations on one index (upsert
// a whole or partial document, delete one, delete by filter) and runs as
// an async consumer on the dispatcher.
//
// # Defining a search projection
//
//	tickets := search.New("ticket_search", search.Config{
//		Index: search.Index{
//			Name:       "tickets",
//			Searchable: []string{"title", "body"},
//			Filterable: []string{"status", "agent"},
//		},
//		Backend: backend, // pgsearch.New(store) or meilisearch.New(...)
//	})
//	err := search.On(tickets, ticketOpened, func(ctx context.Context, ev projector.Event, e TicketOpened, w *search.Writer) error {
//		return w.Upsert(TicketDoc{ID: ev.Stream.ID, Title: e.Title, Status: "open"})
//	})
//
// then tickets.Ensure(ctx) at start (creates the index and applies its
// settings) and tickets.Async() to the dispatcher.
//
// # Delivery
//
// The handlers of a dispatcher batch run first, producing operations in log
// order; the backend then applies them in as few requests as it can. The
// PostgreSQL backend (stores/pgsearch) writes them in the dispatcher's
// transaction, so they commit with the cursor: exactly once. Meilisearch
// (stores/meilisearch) is outside the transaction: the backend returns only
// after Meilisearch reports every task of the batch succeeded, so the
// cursor never passes a document that is not indexed, and a crash repeats
// confirmed work at worst. Every operation is idempotent (upserts and
// patches by primary key, deletes of missing documents succeed), so the
// repetition is harmless. A failed task or an unreachable server is a
// handler error: the batch is retried with backoff (halt mode, dead after
// MaxAttempts) or, in continuous mode, the failing event is found by
// bisecting the batch and dead-lettered.
//
// # Tenancy
//
// An index is tenant-owned unless it is declared [Index.Shared]: each
// document belongs to the tenant of the event that wrote it, documents of
// two tenants may share an id, and [Search] adds the tenant of its
// context ([WithTenant]) to every query, on every backend. A search with no
// tenant in its context fails with [ErrNoTenant] rather than seeing
// everybody's documents.
package search

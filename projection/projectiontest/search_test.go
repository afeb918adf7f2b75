package projectiontest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// A search projection is specified through its Async: with the PostgreSQL
// full-text backend its documents are rows of the spec's transaction.
func TestSpec_SearchProjection(t *testing.T) {
	t.Parallel()
	k := setup(t)
	b, err := pgsearch.New(k.store, pgsearch.Config{})
	must(t, err)
	idx := search.Index{Name: "tickets"}
	p := search.New("ticket_search", search.Config{Index: idx, Backend: b})
	must(t, search.On(p, k.ty.Opened, func(_ context.Context, ev projector.Event, e testevents.TicketOpened, w *search.Writer) error {
		return w.Upsert(map[string]string{"id": ev.Stream.ID, "title": e.Title})
	}))
	must(t, search.On(p, k.ty.Closed, func(_ context.Context, ev projector.Event, _ testevents.TicketClosed, w *search.Writer) error {
		return w.Delete(ev.Stream.ID)
	}))
	must(t, p.Ensure(context.Background()))
	async, err := p.Async()
	must(t, err)
	table := pgx.Identifier{k.store.Schema(), pgsearch.TableName(idx)}.Sanitize()

	projectiontest.New(t, projectiontest.Config{Store: k.store, Async: async}).
		Given(projector.Stream("ticket", "s-1"), testevents.TicketOpened{Title: "Printer on fire"}).
		Given(projector.Stream("ticket", "s-2"), testevents.TicketOpened{Title: "VPN"}, testevents.TicketClosed{}).
		ThenRows(`SELECT count(*) FROM `+table, projectiontest.Row{1})
	if docs, err := b.Documents(context.Background(), idx); err != nil || len(docs) != 0 {
		t.Fatalf("documents outside the spec: %v, %v; want none", docs, err)
	}
}

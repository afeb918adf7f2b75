package search_test

import (
	"testing"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// TestBadDocumentParksItsStream: a search projection in ParkStream mode
// parks the stream whose event makes a bad document, holds that stream's
// later events behind it (the index never shows them ahead of the parked
// one), and goes on indexing the other streams; a discard makes the stream
// live again from its next event.
func TestBadDocumentParksItsStream(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p := e.ticketProjection("ticket_search", bc.make(e), projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1})
			e.append("acme", "T-1", testevents.TicketOpened{Title: "before"})
			e.append("acme", "T-2", testevents.TicketOpened{Title: "poisoned"}, testevents.TicketCommented{Body: "poison"})
			e.append("acme", "T-2", testevents.TicketClosed{}) // held behind the park
			e.append("acme", "T-3", testevents.TicketOpened{Title: "after"})
			d := e.dispatcher(p)
			e.catchUp(d)

			parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "ticket_search", Status: projection.ParkOpen})
			must(t, err)
			if len(parks) != 1 || parks[0].StreamID != "T-2" || parks[0].EventType != "ticket.commented" || parks[0].Events != 2 {
				t.Fatalf("parks %+v, want T-2's from its comment, holding the comment and the close", parks)
			}
			sameIndex(t, "with T-2 parked", []string{
				`acme/T-1 {"id":"T-1","status":"open","title":"before"}`,
				`acme/T-2 {"id":"T-2","status":"open","title":"poisoned"}`,
				`acme/T-3 {"id":"T-3","status":"open","title":"after"}`,
			}, indexed(t, e.ctx, p.SearchBackend()))

			if _, err := projection.DiscardPark(e.ctx, e.store, parks[0].ID, "test"); err != nil {
				t.Fatal(err)
			}
			e.append("acme", "T-2", testevents.TicketClosed{})
			e.catchUp(d)
			sameIndex(t, "after the discard", []string{
				`acme/T-1 {"id":"T-1","status":"open","title":"before"}`,
				`acme/T-2 {"id":"T-2","status":"closed","title":"poisoned"}`,
				`acme/T-3 {"id":"T-3","status":"open","title":"after"}`,
			}, indexed(t, e.ctx, p.SearchBackend()))
		})
	}
}

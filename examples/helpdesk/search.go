package helpdesk

import (
	"context"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/search"
)

// TicketDoc is a ticket as the ticket search index holds it.
type TicketDoc struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	Subject     string `json:"subject"`
	Status      string `json:"status"` // open, assigned, closed
	Agent       string `json:"agent,omitempty"`
	LastComment string `json:"last_comment,omitempty"`
	Resolution  string `json:"resolution,omitempty"`
}

// TicketIndex is the ticket search index: full text over subject,
// comments and resolution; filterable by status, agent and customer.
var TicketIndex = search.Index{
	Name:       "tickets",
	Searchable: []string{"subject", "last_comment", "resolution", "customer"},
	Filterable: []string{"status", "agent", "customer"},
	Sortable:   []string{"id"},
}

// TicketSearch is the ticket search projection's usual consumer name.
const TicketSearch = "ticket_search"

// NewTicketSearch returns a search projection called name (its consumer;
// usually [TicketSearch], another for a second backend) that keeps
// TicketIndex on backend: an opened ticket is a new document, later events
// patch the attributes they change.
func NewTicketSearch(types Types, name string, backend search.Backend) (*search.Projection, error) {
	p := search.New(name, search.Config{Index: TicketIndex, Backend: backend})
	errs := []error{
		search.On(p, types.TicketOpened, func(_ context.Context, ev projector.Event, e TicketOpened, w *search.Writer) error {
			return w.Upsert(TicketDoc{ID: ev.Stream.ID, Customer: e.Customer, Subject: e.Subject, Status: "open"})
		}),
		search.On(p, types.TicketAssigned, func(_ context.Context, ev projector.Event, e TicketAssigned, w *search.Writer) error {
			return w.Patch(ev.Stream.ID, map[string]string{"agent": e.Agent, "status": "assigned"})
		}),
		search.On(p, types.TicketCommented, func(_ context.Context, ev projector.Event, e TicketCommented, w *search.Writer) error {
			return w.Patch(ev.Stream.ID, map[string]string{"last_comment": e.Body})
		}),
		search.On(p, types.TicketClosed, func(_ context.Context, ev projector.Event, e TicketClosed, w *search.Writer) error {
			return w.Patch(ev.Stream.ID, map[string]string{"status": "closed", "resolution": e.Resolution})
		}),
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if _, err := p.Async(); err != nil {
		return nil, err
	}
	return p, nil
}

package helpdesk

import (
	"context"
	"errors"

	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/stores/postgres"
)

// Ticket is the ticket aggregate's state, folded from its stream.
type Ticket struct {
	Customer string `json:"customer"`
	Subject  string `json:"subject"`
	Agent    string `json:"agent,omitempty"`
	Status   string `json:"status"` // open, assigned, closed
	Comments int    `json:"comments"`
}

// Command refusals. They are the domain saying no, not failures: the
// command handler returns them without retrying.
var (
	ErrTicketExists   = errors.New("ticket already exists")
	ErrNoTicket       = errors.New("no such ticket")
	ErrTicketClosed   = errors.New("ticket is closed")
	ErrNotAssignedYet = errors.New("ticket must be assigned before it is closed")
)

// NewTickets returns the ticket repository: folds for every ticket event and
// a snapshot every 50 events.
func NewTickets(store *postgres.Store, t Types) (*aggregate.Repository[Ticket], error) {
	return aggregate.New(store, aggregate.Config[Ticket]{
		Name: "ticket",
		Folds: []aggregate.Fold[Ticket]{
			aggregate.On(t.TicketOpened, func(s *Ticket, e TicketOpened) {
				s.Customer, s.Subject, s.Status = e.Customer, e.Subject, "open"
			}),
			aggregate.On(t.TicketAssigned, func(s *Ticket, e TicketAssigned) { s.Agent, s.Status = e.Agent, "assigned" }),
			aggregate.On(t.TicketCommented, func(s *Ticket, _ TicketCommented) { s.Comments++ }),
			aggregate.On(t.TicketClosed, func(s *Ticket, _ TicketClosed) { s.Status = "closed" }),
		},
		Snapshots: aggregate.Snapshots{Every: 50},
	})
}

// OpenTicket is the command a customer sends to open a ticket.
func OpenTicket(customer, subject string) aggregate.Decide[Ticket] {
	return func(_ context.Context, t aggregate.Loaded[Ticket]) ([]any, error) {
		if t.Exists() {
			return nil, ErrTicketExists
		}
		return []any{TicketOpened{Customer: customer, Subject: subject}}, nil
	}
}

// AssignTicket gives the ticket to an agent; assigning it to its agent again
// changes nothing.
func AssignTicket(agent string) aggregate.Decide[Ticket] {
	return func(_ context.Context, t aggregate.Loaded[Ticket]) ([]any, error) {
		switch {
		case !t.Exists():
			return nil, ErrNoTicket
		case t.State.Status == "closed":
			return nil, ErrTicketClosed
		case t.State.Agent == agent:
			return nil, nil
		}
		return []any{TicketAssigned{Agent: agent}}, nil
	}
}

// CommentTicket adds a comment to an open ticket.
func CommentTicket(author, body string) aggregate.Decide[Ticket] {
	return func(_ context.Context, t aggregate.Loaded[Ticket]) ([]any, error) {
		switch {
		case !t.Exists():
			return nil, ErrNoTicket
		case t.State.Status == "closed":
			return nil, ErrTicketClosed
		}
		return []any{TicketCommented{Author: author, Body: body}}, nil
	}
}

// CloseTicket resolves an assigned ticket; closing it again changes nothing.
func CloseTicket(resolution string) aggregate.Decide[Ticket] {
	return func(_ context.Context, t aggregate.Loaded[Ticket]) ([]any, error) {
		switch {
		case !t.Exists():
			return nil, ErrNoTicket
		case t.State.Status == "closed":
			return nil, nil
		case t.State.Status == "open":
			return nil, ErrNotAssignedYet
		}
		return []any{TicketClosed{Resolution: resolution}}, nil
	}
}

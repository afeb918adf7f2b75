package helpdesk

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/saga"
)

// The SLA process manager: a high-priority ticket must be assigned within
// SLAResponse. Half-way through an unassigned one gets a reminder comment;
// at the deadline it is escalated. Both go onto the ticket's stream through
// the ticket aggregate, so they never land on a ticket that was assigned or
// closed meanwhile. Assigning or closing the ticket ends the saga and
// cancels what was pending.
const (
	// SLAName is the saga's name (its consumer and its rows).
	SLAName = "ticket_sla"
	// SLAResponse is how long a high-priority ticket may stay unassigned.
	SLAResponse = 4 * time.Hour
)

// TicketEscalated: a high-priority ticket went unassigned past its SLA.
type TicketEscalated struct {
	Reason string `json:"reason"`
}

// DefineSLA defines the SLA's event type in r, beside [Define]'s.
func DefineSLA(r *projector.Registry) (projector.EventType[TicketEscalated], error) {
	return projector.Define[TicketEscalated](r, "ticket.escalated")
}

// SLAState is what the SLA saga keeps per ticket.
type SLAState struct {
	Priority  string `json:"priority"`
	Reminded  bool   `json:"reminded,omitempty"`
	Escalated bool   `json:"escalated,omitempty"`
}

// Priority is the helpdesk's triage rule: outages are high priority.
func Priority(subject string) string {
	if strings.Contains(subject, "on fire") || strings.Contains(subject, "cannot log in") {
		return "high"
	}
	return "normal"
}

// NewSLA defines the SLA saga over the helpdesk's types and ticket
// repository; now is its clock (nil: time.Now), which the demo compresses.
func NewSLA(t Types, tickets *aggregate.Repository[Ticket], now func() time.Time) (*saga.Saga[SLAState], error) {
	if tickets == nil {
		return nil, errors.New("helpdesk: the SLA saga needs the ticket repository")
	}
	sla := saga.New[SLAState](SLAName, saga.Config{Now: now})
	errs := []error{
		saga.StartOn(sla, t.TicketOpened, saga.ByStream, func(_ context.Context, in *saga.Instance[SLAState], _ projector.Event, e TicketOpened) error {
			in.State.Priority = Priority(e.Subject)
			if in.State.Priority != "high" {
				in.Complete() // no SLA to watch
				return nil
			}
			in.After("remind", SLAResponse/2)
			in.After("escalate", SLAResponse)
			return nil
		}),
		saga.On(sla, t.TicketAssigned, saga.ByStream, func(_ context.Context, in *saga.Instance[SLAState], _ projector.Event, _ TicketAssigned) error {
			in.Cancel("remind")
			in.Cancel("escalate")
			in.Complete()
			return nil
		}),
		saga.On(sla, t.TicketClosed, saga.ByStream, func(_ context.Context, in *saga.Instance[SLAState], _ projector.Event, _ TicketClosed) error {
			in.Complete()
			return nil
		}),
		saga.OnTimeout(sla, "remind", func(_ context.Context, in *saga.Instance[SLAState], _ saga.Timeout) error {
			in.State.Reminded = true
			saga.Command(in, tickets, ticketStream(in), whileUnassigned(TicketCommented{Author: "sla", Body: "reminder: high priority, still unassigned"}))
			return nil
		}),
		saga.OnTimeout(sla, "escalate", func(_ context.Context, in *saga.Instance[SLAState], _ saga.Timeout) error {
			in.State.Escalated = true
			saga.Command(in, tickets, ticketStream(in), whileUnassigned(TicketEscalated{Reason: "unassigned after " + SLAResponse.String()}))
			in.Complete()
			return nil
		}),
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return sla, nil
}

func ticketStream(in *saga.Instance[SLAState]) projector.StreamRef {
	return projector.TenantStream(in.Tenant(), TicketStream, in.Key())
}

// whileUnassigned appends payload unless the ticket was assigned or closed
// meanwhile: the aggregate's state is the truth, whatever the saga believed.
func whileUnassigned(payload any) aggregate.Decide[Ticket] {
	return func(_ context.Context, t aggregate.Loaded[Ticket]) ([]any, error) {
		if !t.Exists() || t.State.Status != "open" {
			return nil, nil
		}
		return []any{payload}, nil
	}
}

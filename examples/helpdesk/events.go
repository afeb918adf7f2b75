// Package helpdesk is Projector's example application: a small helpdesk
// where customers open tickets, agents are assigned, comment and close them.
// It uses Projector the way an application would (public packages only) and
// is what `projector demo` runs.
package helpdesk

import (
	"errors"

	"github.com/projectorhq/projector"
)

// Stream types of the helpdesk.
const (
	TicketStream   = "ticket"
	CustomerStream = "customer"
	AgentStream    = "agent"
	// SessionStream holds agents' presence pings: ephemeral, prunable.
	SessionStream = "session"
)

// Ephemeral are the stream types retention may delete by default.
var Ephemeral = []string{SessionStream}

// CustomerRegistered: a customer signed up.
type CustomerRegistered struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// Validate refuses a customer without a name or email.
func (e CustomerRegistered) Validate() error {
	if e.Name == "" || e.Email == "" {
		return errors.New("customer needs a name and an email")
	}
	return nil
}

// AgentJoined: an agent joined the support team.
type AgentJoined struct {
	Name string `json:"name"`
}

// TicketOpened: a customer opened a ticket.
type TicketOpened struct {
	Customer string `json:"customer"`
	Subject  string `json:"subject"`
}

// Validate refuses a ticket without a customer or subject.
func (e TicketOpened) Validate() error {
	if e.Customer == "" || e.Subject == "" {
		return errors.New("ticket needs a customer and a subject")
	}
	return nil
}

// TicketAssigned: the ticket was given to an agent.
type TicketAssigned struct {
	Agent string `json:"agent"`
}

// TicketCommented: someone wrote on the ticket.
type TicketCommented struct {
	Author string `json:"author"`
	Body   string `json:"body"`
}

// AgentPinged: an agent's console reported the agent present. Kept only
// for a while (see Ephemeral).
type AgentPinged struct {
	Agent string `json:"agent"`
}

// TicketClosed: the ticket is resolved.
type TicketClosed struct {
	Resolution string `json:"resolution"`
}

// Types are the helpdesk's event types, defined in one registry.
type Types struct {
	Registry           *projector.Registry
	CustomerRegistered projector.EventType[CustomerRegistered]
	AgentJoined        projector.EventType[AgentJoined]
	TicketOpened       projector.EventType[TicketOpened]
	TicketAssigned     projector.EventType[TicketAssigned]
	TicketCommented    projector.EventType[TicketCommented]
	TicketClosed       projector.EventType[TicketClosed]
	AgentPinged        projector.EventType[AgentPinged]
}

// Define defines the helpdesk's event types in r.
func Define(r *projector.Registry) (Types, error) {
	var t Types
	var err error
	t.Registry = r
	if t.CustomerRegistered, err = projector.Define[CustomerRegistered](r, "customer.registered"); err != nil {
		return t, err
	}
	if t.AgentJoined, err = projector.Define[AgentJoined](r, "agent.joined"); err != nil {
		return t, err
	}
	if t.TicketOpened, err = projector.Define[TicketOpened](r, "ticket.opened"); err != nil {
		return t, err
	}
	if t.TicketAssigned, err = projector.Define[TicketAssigned](r, "ticket.assigned"); err != nil {
		return t, err
	}
	if t.TicketCommented, err = projector.Define[TicketCommented](r, "ticket.commented"); err != nil {
		return t, err
	}
	if t.TicketClosed, err = projector.Define[TicketClosed](r, "ticket.closed"); err != nil {
		return t, err
	}
	if t.AgentPinged, err = projector.Define[AgentPinged](r, "agent.pinged"); err != nil {
		return t, err
	}
	return t, nil
}

// Package testevents defines a small helpdesk vocabulary for tests of every
// package, so each test file does not redefine its own.
package testevents

import (
	"errors"

	"github.com/projectorhq/projector"
)

// TicketOpened opens a ticket.
type TicketOpened struct {
	Title    string `json:"title"`
	Customer string `json:"customer,omitempty"`
}

// Validate refuses a ticket without a title.
func (e TicketOpened) Validate() error {
	if e.Title == "" {
		return errors.New("title is required")
	}
	return nil
}

// TicketCommented adds a comment.
type TicketCommented struct {
	Body string `json:"body"`
	N    int    `json:"n,omitempty"`
}

// TicketClosed closes a ticket.
type TicketClosed struct {
	Reason string `json:"reason,omitempty"`
}

// Types are the handles of one registry's definitions.
type Types struct {
	Registry  *projector.Registry
	Opened    projector.EventType[TicketOpened]
	Commented projector.EventType[TicketCommented]
	Closed    projector.EventType[TicketClosed]
}

// New defines the vocabulary in a fresh registry.
func New() Types {
	r := projector.NewRegistry()
	return Types{
		Registry:  r,
		Opened:    projector.MustDefine[TicketOpened](r, "ticket.opened"),
		Commented: projector.MustDefine[TicketCommented](r, "ticket.commented"),
		Closed:    projector.MustDefine[TicketClosed](r, "ticket.closed"),
	}
}

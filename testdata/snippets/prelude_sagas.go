package snippets

import (
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// The helpdesk's ticket aggregate and its SLA event.
type Ticket struct {
	Customer string `json:"customer"`
	Subject  string `json:"subject"`
	Agent    string `json:"agent,omitempty"`
	Status   string `json:"status"`
}

type TicketEscalated struct {
	Reason string `json:"reason"`
}

var tickets *aggregate.Repository[Ticket]

// Inside a step of a saga whose state is SLAState.
type SLAState struct{}

var in *saga.Instance[SLAState]

// The saga of the page's first block, built.
var payment *saga.Saga[PaymentState]

var projections []*projection.Async

var newPayment func(store *postgres.Store) (*saga.Saga[PaymentState], error)

// Package snippets holds what the docs' Go blocks take for granted: the
// names getting-started introduces and a handler's surroundings. The docs
// test (docs_test.go) compiles every block with these declarations beside
// it, minus any name the page declares itself; prelude_<page>.go adds the
// names one page assumes.
package snippets

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// The events of getting-started.md.
type TicketOpened struct {
	Customer string `json:"customer"`
	Subject  string `json:"subject"`
}

type TicketAssigned struct {
	Agent string `json:"agent"`
}

type TicketCommented struct {
	Author string `json:"author"`
	Body   string `json:"body"`
}

type TicketClosed struct {
	Resolution string `json:"resolution"`
}

// A function returning error with a ctx, a pool and the store, as
// getting-started sets them up.
var ctx context.Context

var pool *pgxpool.Pool

var reg *projector.Registry

var registry *projector.Registry

var store *postgres.Store

var ticketOpened projector.EventType[TicketOpened]

var ticketAssigned projector.EventType[TicketAssigned]

var ticketCommented projector.EventType[TicketCommented]

var ticketClosed projector.EventType[TicketClosed]

// Inside a handler or a test.
var tx pgx.Tx

var ev projector.Event

var t *testing.T

// The projections of projections.md.
var summary *projection.Inline

var workload *projection.Async

var d *projection.Dispatcher

package helpdesk_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection/projectiontest"
)

// The helpdesk's read models, specified event by event with the test kit:
// each spec runs in a transaction of its own, rolled back, in parallel
// with the others, on one set of tables. Parallel specs use distinct keys
// (tickets, agents): two open transactions writing one key wait for each
// other.
func TestProjectionSpecs(t *testing.T) {
	t.Parallel()
	reg := projector.NewRegistry()
	types, err := helpdesk.Define(reg)
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, reg)
	var mail bytes.Buffer // only the welcome spec writes, and it runs alone
	app, err := helpdesk.NewApp(types, store.Schema(), &mail)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Migrate(context.Background(), store.Pool()); err != nil {
		t.Fatal(err)
	}
	table := func(name string) string { return pgx.Identifier{store.Schema(), name}.Sanitize() }
	ticket := func(id string) projector.StreamRef { return projector.Stream(helpdesk.TicketStream, id) }

	t.Run("summary: a ticket's row follows it from opened to closed", func(t *testing.T) {
		t.Parallel()
		s := projectiontest.New(t, projectiontest.Config{Store: store, Inline: app.Summary, Deterministic: true})
		s.Given(ticket("T-1"), helpdesk.TicketOpened{Customer: "ada", Subject: "Printer"}).
			ThenRows(`SELECT ticket_id, customer, subject, status, agent, comments, updated_at FROM `+table(helpdesk.SummaryTable),
				projectiontest.Row{"T-1", "ada", "Printer", "open", nil, 0, projectiontest.Start})
		s.Clock().Advance(30 * 60e9)
		s.When(ticket("T-1"), helpdesk.TicketAssigned{Agent: "alice"}, helpdesk.TicketCommented{Author: "alice", Body: "on it"},
			helpdesk.TicketClosed{Resolution: "fixed"}).
			ThenRows(`SELECT status, agent, comments, updated_at FROM `+table(helpdesk.SummaryTable),
				projectiontest.Row{"closed", "alice", 1, "2026-01-01T09:30:00Z"})
	})

	t.Run("workload v1: a reassigned ticket stays open on its first agent", func(t *testing.T) {
		t.Parallel()
		projectiontest.New(t, projectiontest.Config{Store: store, Async: app.Workload}).
			Given(ticket("W-1"), helpdesk.TicketAssigned{Agent: "alice"}, helpdesk.TicketAssigned{Agent: "bob"}).
			Given(ticket("W-2"), helpdesk.TicketAssigned{Agent: "bob"}).
			When(ticket("W-2"), helpdesk.TicketClosed{}).
			ThenRows(`SELECT agent, open, closed FROM `+table(helpdesk.WorkloadTable)+` ORDER BY agent`,
				projectiontest.Row{"alice", 1, 0}, projectiontest.Row{"bob", 1, 1})
	})

	t.Run("workload v2: a reassigned ticket moves", func(t *testing.T) {
		t.Parallel()
		v2, err := helpdesk.NewWorkload(types, store.Schema(), 2)
		if err != nil {
			t.Fatal(err)
		}
		projectiontest.New(t, projectiontest.Config{Store: store, Async: v2}).
			Given(ticket("W-3"), helpdesk.TicketAssigned{Agent: "carol"}, helpdesk.TicketAssigned{Agent: "dave"}).
			When(ticket("W-3"), helpdesk.TicketClosed{}).
			ThenRows(`SELECT agent, open, closed FROM `+table(helpdesk.WorkloadTable)+` ORDER BY agent`,
				projectiontest.Row{"carol", 0, 0}, projectiontest.Row{"dave", 0, 1})
	})

	t.Run("history: every ticket event under its customer, across batches", func(t *testing.T) {
		t.Parallel()
		projectiontest.New(t, projectiontest.Config{Store: store, Async: app.History, Deterministic: true}).
			Given(ticket("H-1"), helpdesk.TicketOpened{Customer: "grace", Subject: "VPN"}).
			When(ticket("H-1"), helpdesk.TicketCommented{Author: "grace", Body: "still down"}, helpdesk.TicketClosed{}).
			ThenRows(`SELECT customer, ticket_id, version, event_type FROM `+table(helpdesk.HistoryTable)+` ORDER BY version`,
				projectiontest.Row{"grace", "H-1", 1, "ticket.opened"},
				projectiontest.Row{"grace", "H-1", 2, "ticket.commented"},
				projectiontest.Row{"grace", "H-1", 3, "ticket.closed"})
	})

	t.Run("welcome: one mail per registration, recorded by event id", func(t *testing.T) {
		s := projectiontest.New(t, projectiontest.Config{Store: store, Async: app.Welcome, Deterministic: true})
		s.Given(projector.Stream(helpdesk.CustomerStream, "ada"), helpdesk.CustomerRegistered{Name: "ada", Email: "ada@example.com"}).
			ThenRows(`SELECT customer, email FROM `+table(helpdesk.WelcomeTable), projectiontest.Row{"ada", "ada@example.com"})
		if got := mail.String(); strings.Count(got, "to ada <ada@example.com>") != 1 {
			t.Errorf("mail sent: %q, want one welcome to ada", got)
		}
	})
}

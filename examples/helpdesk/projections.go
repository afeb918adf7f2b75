package helpdesk

import (
	"context"
	"fmt"
	"io"
	"maps"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// App is the helpdesk's read side: its tables and the projections that fill
// them, one of each kind Projector offers.
type App struct {
	Types Types
	// Summary (inline) keeps one row per ticket, committed with the events.
	Summary *projection.Inline
	// Workload (async, per-event handlers) counts open and closed tickets
	// per agent.
	Workload *projection.Async
	// History (async, batch handler) lists every ticket event per customer,
	// written set-based.
	History *projection.Async
	// Welcome (async, side effect) sends each new customer a welcome
	// message: an effect outside PostgreSQL, made idempotent by event id.
	Welcome *projection.Async
	// Live (async, per-instance) counts events per type in memory, on every
	// instance, from committed batches only.
	Live *projection.Async
	// Counter is what Live counts into.
	Counter *LiveCounter

	schema string
}

// Table names, in the App's schema.
const (
	SummaryTable  = "helpdesk_ticket_summary"
	WorkloadTable = "helpdesk_agent_workload"
	AssignTable   = "helpdesk_workload_tickets"
	HistoryTable  = "helpdesk_customer_history"
	WelcomeTable  = "helpdesk_welcome_sent"
)

// NewApp builds the helpdesk's projections over tables in schema. Welcome
// messages are "sent" by writing a line to mail (a stand-in for a mail API).
func NewApp(types Types, schema string, mail io.Writer) (*App, error) {
	a := &App{Types: types, schema: schema, Counter: &LiveCounter{counts: map[string]int64{}}}
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }

	a.Summary = projection.NewInline("ticket_summary")
	summary := t(SummaryTable)
	errs := []error{
		projection.On(a.Summary, types.TicketOpened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e TicketOpened) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+summary+` (ticket_id, customer, subject, status, updated_at)
				VALUES ($1, $2, $3, 'open', $4)`, ev.Stream.ID, e.Customer, e.Subject, ev.RecordedAt)
			return err
		}),
		projection.On(a.Summary, types.TicketAssigned, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e TicketAssigned) error {
			_, err := tx.Exec(ctx, `UPDATE `+summary+` SET agent = $2, status = 'assigned', updated_at = $3 WHERE ticket_id = $1`, ev.Stream.ID, e.Agent, ev.RecordedAt)
			return err
		}),
		projection.On(a.Summary, types.TicketCommented, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ TicketCommented) error {
			_, err := tx.Exec(ctx, `UPDATE `+summary+` SET comments = comments + 1, updated_at = $2 WHERE ticket_id = $1`, ev.Stream.ID, ev.RecordedAt)
			return err
		}),
		projection.On(a.Summary, types.TicketClosed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ TicketClosed) error {
			_, err := tx.Exec(ctx, `UPDATE `+summary+` SET status = 'closed', updated_at = $2 WHERE ticket_id = $1`, ev.Stream.ID, ev.RecordedAt)
			return err
		}),
	}

	workload, err := NewWorkload(types, schema, WorkloadVersion)
	if err != nil {
		return nil, err
	}
	a.Workload = workload

	a.History = projection.NewAsync("customer_history", projection.AsyncConfig{})
	history := t(HistoryTable)
	errs = append(errs, projection.OnBatch(a.History, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		// One statement for the whole batch: the customer of a ticket comes
		// from its ticket.opened event, or from rows already written.
		var tickets, customers, types []string
		var versions []int64
		var ats []any
		for _, s := range b.Streams {
			customer := ""
			for _, ev := range s.Events {
				if o, ok := ev.Payload.(TicketOpened); ok {
					customer = o.Customer
				}
				tickets, customers, types = append(tickets, s.Stream.ID), append(customers, customer), append(types, ev.Type)
				versions, ats = append(versions, ev.Version), append(ats, ev.RecordedAt)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+history+` (customer, ticket_id, version, event_type, at)
			SELECT coalesce(NULLIF(x.customer, ''),
			                (SELECT h.customer FROM `+history+` h WHERE h.ticket_id = x.ticket_id LIMIT 1), '?'),
			       x.ticket_id, x.version, x.event_type, x.at
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[]) AS x(ticket_id, customer, version, event_type, at)
			ON CONFLICT DO NOTHING`, tickets, customers, versions, types, ats)
		return err
	}, types.TicketOpened, types.TicketAssigned, types.TicketCommented, types.TicketClosed))

	a.Welcome = projection.NewAsync("welcome_mail", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors})
	welcome := t(WelcomeTable)
	var mailMu sync.Mutex
	errs = append(errs, projection.On(a.Welcome, types.CustomerRegistered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e CustomerRegistered) error {
		// Idempotent by event id: a replayed batch finds the row and does not
		// send twice. (A crash between the send and the commit would send
		// once more: effects outside PostgreSQL are at least once.)
		tag, err := tx.Exec(ctx, `INSERT INTO `+welcome+` (event_id, customer, email) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
			ev.ID, e.Name, e.Email)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		mailMu.Lock()
		defer mailMu.Unlock()
		_, err = fmt.Fprintf(mail, "to %s <%s>: Welcome to the helpdesk, %s! (message %s)\n", e.Name, e.Email, e.Name, ev.ID)
		return err
	}))

	a.Live = projection.NewAsync("live_counter", projection.AsyncConfig{
		Delivery:    projection.PerInstance,
		StartFrom:   projection.FromBeginning,
		AfterCommit: a.Counter.add,
	})
	noop := func(context.Context, pgx.Tx, projector.Event) error { return nil }
	for _, et := range []projection.TypeName{types.CustomerRegistered, types.AgentJoined, types.TicketOpened, types.TicketAssigned, types.TicketCommented, types.TicketClosed} {
		errs = append(errs, projection.OnEvent(a.Live, et, noop))
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Inline returns the projections the store applies on every append.
func (a *App) Inline() []postgres.InlineProjection { return []postgres.InlineProjection{a.Summary} }

// Async returns the projections the dispatcher runs.
func (a *App) Async() []*projection.Async {
	return []*projection.Async{a.Workload, a.History, a.Welcome, a.Live}
}

// Migrate creates the helpdesk's read-model tables if they do not exist.
func (a *App) Migrate(ctx context.Context, db postgres.DBTX) error {
	t := func(name string) string { return pgx.Identifier{a.schema, name}.Sanitize() }
	_, err := db.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+t(SummaryTable)+` (
			ticket_id text PRIMARY KEY, customer text NOT NULL, subject text NOT NULL, status text NOT NULL,
			agent text, comments int NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL);
		CREATE TABLE IF NOT EXISTS `+t(WorkloadTable)+` (
			agent text PRIMARY KEY, open int NOT NULL DEFAULT 0, closed int NOT NULL DEFAULT 0);
		CREATE TABLE IF NOT EXISTS `+t(AssignTable)+` (ticket_id text PRIMARY KEY, agent text NOT NULL);
		CREATE TABLE IF NOT EXISTS `+t(HistoryTable)+` (
			customer text NOT NULL, ticket_id text NOT NULL, version bigint NOT NULL, event_type text NOT NULL,
			at timestamptz NOT NULL, PRIMARY KEY (ticket_id, version));
		CREATE INDEX IF NOT EXISTS helpdesk_customer_history_customer ON `+t(HistoryTable)+` (customer);
		CREATE TABLE IF NOT EXISTS `+t(WelcomeTable)+` (
			event_id uuid PRIMARY KEY, customer text NOT NULL, email text NOT NULL, sent_at timestamptz NOT NULL DEFAULT now());`)
	if err != nil {
		return fmt.Errorf("helpdesk tables: %w", err)
	}
	return nil
}

// LiveCounter counts committed events per type, in memory.
type LiveCounter struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (c *LiveCounter) add(events []projector.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range events {
		c.counts[ev.Type]++
	}
}

// Counts returns a copy of the counts.
func (c *LiveCounter) Counts() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

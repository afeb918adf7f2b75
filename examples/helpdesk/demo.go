package helpdesk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Limits of [DemoConfig]'s sizes.
const (
	MaxDemoUsers   = 1000
	MaxDemoActions = 1_000_000
)

// ErrNotDemoSchema: the demo was pointed at a schema that exists and that it
// did not create. It drops its schema on every run, so it only ever drops
// one that carries its mark.
var ErrNotDemoSchema = errors.New("not a demo schema")

// demoMark is the comment the demo sets on the schema it creates, at
// creation: the only proof that a schema is the demo's to drop.
const demoMark = "projector demo: created by RunDemo, dropped and recreated on every run"

// DemoConfig sizes the demo.
type DemoConfig struct {
	// Schema is where the demo's tables go. The demo creates it and marks it
	// as its own; on the next run it drops and recreates a schema with that
	// mark, and refuses ([ErrNotDemoSchema]) one without. Default
	// "projector_demo".
	Schema string
	// Users is how many simulated customers and agents act at once;
	// default 8, at most MaxDemoUsers.
	Users int
	// Actions is how many commands each user sends; default 400, at most
	// MaxDemoActions.
	Actions int
	// Seed makes the simulated choices repeatable; default 1.
	Seed uint64
	// Progress draws a progress bar while the dispatcher catches up.
	Progress bool
}

var (
	customers = []string{"ada", "grace", "linus", "barbara", "ken", "margaret"}
	agents    = []string{"alice", "bob", "carol"}
	subjects  = []string{"printer on fire", "cannot log in", "invoice is wrong", "feature request: dark mode", "password reset"}
)

// RunDemo runs the helpdesk end to end on pool: it resets the demo schema,
// migrates it, lets simulated users work through tickets concurrently (each
// command through the ticket aggregate, retried on conflicts), runs the
// dispatcher until every projection caught up, and prints the read models,
// the consumers' status and a retention pass.
func RunDemo(ctx context.Context, pool *pgxpool.Pool, out io.Writer, cfg DemoConfig) error {
	cfg.Schema = cmp.Or(cfg.Schema, "projector_demo")
	cfg.Users = cmp.Or(cfg.Users, 8)
	cfg.Actions = cmp.Or(cfg.Actions, 400)
	cfg.Seed = cmp.Or(cfg.Seed, 1)
	if err := postgres.ValidateSchema(cfg.Schema); err != nil {
		return err
	}
	if cfg.Users < 1 || cfg.Users > MaxDemoUsers || cfg.Actions < 1 || cfg.Actions > MaxDemoActions {
		return fmt.Errorf("demo: %d users and %d actions: want 1 to %d users and 1 to %d actions", cfg.Users, cfg.Actions, MaxDemoUsers, MaxDemoActions)
	}
	if err := resetSchema(ctx, pool, cfg.Schema); err != nil {
		return err
	}
	applied, err := postgres.Migrate(ctx, pool, cfg.Schema)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "schema %s: applied migrations %v\n", cfg.Schema, applied)

	types, err := Define(projector.NewRegistry())
	if err != nil {
		return err
	}
	var mail strings.Builder
	app, err := NewApp(types, cfg.Schema, &syncWriter{w: &mail})
	if err != nil {
		return err
	}
	if err := app.Migrate(ctx, pool); err != nil {
		return err
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: cfg.Schema, Registry: types.Registry, Inline: app.Inline(), Ephemeral: Ephemeral})
	if err != nil {
		return err
	}
	tickets, err := NewTickets(store, types)
	if err != nil {
		return err
	}

	sim := &simulation{store: store, tickets: tickets, cfg: cfg}
	started := time.Now()
	if err := sim.run(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d simulated users sent %d commands in %v: %d events appended, %d refused by the ticket aggregate, %d version conflicts retried\n",
		cfg.Users, sim.commands.Load(), time.Since(started).Round(time.Millisecond), sim.events.Load(), sim.refused.Load(), sim.retries.Load())

	if err := slaDemo(ctx, store, types, tickets, out); err != nil { // demo_sla.go
		return err
	}
	if err := catchUp(ctx, store, app, out, cfg.Progress); err != nil {
		return err
	}
	if err := report(ctx, store, app, tickets, out); err != nil {
		return err
	}
	if err := demoSearch(ctx, store, types, out); err != nil {
		return err
	}
	if err := demoRelay(ctx, store, out); err != nil { // demo_relay.go
		return err
	}
	fmt.Fprintf(out, "\n== Welcome mails (side effect, once per customer)\n%s", mail.String())

	shards, err := projection.NewAdmin(store).List(ctx, "")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Consumers (`projector status`)\n")
	if err := cli.WriteStatus(out, shards, false); err != nil {
		return err
	}

	res, err := store.Prune(ctx, postgres.PruneOptions{OlderThan: time.Millisecond})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Retention (`projector events prune --older-than 1ms`)\ndeleted %d agent pings of stream type %q; every consumer had passed them; ticket streams are aggregate history, never pruned unless named and included\n",
		res.Deleted, SessionStream)
	return demoRebuild(ctx, store, app, out, cfg.Progress)
}

// resetSchema drops the demo's schema from an earlier run, if there is one,
// and creates it afresh with the demo's mark. A schema that exists without
// the mark is someone else's: it is refused, never dropped.
func resetSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	ident := pgx.Identifier{schema}.Sanitize()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Two demos on one schema take turns rather than drop each
		// other's tables half-way.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('projector demo schema ' || $1))`, schema); err != nil {
			return err
		}
		var comment *string
		err := tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, schema).Scan(&comment)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case (comment == nil || *comment != demoMark) && !leftByOlderDemo(ctx, tx, schema):
			return fmt.Errorf("schema %q exists and was not created by the demo, which drops its schema on every run: "+
				"choose another --demo-schema, or drop it yourself if it is a leftover of an older demo (DROP SCHEMA %s CASCADE): %w",
				schema, ident, ErrNotDemoSchema)
		default:
			if _, err := tx.Exec(ctx, `DROP SCHEMA `+ident+` CASCADE`); err != nil {
				return err
			}
		}
		if err := dropRebuildLeftovers(ctx, tx, schema); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `CREATE SCHEMA `+ident+`; COMMENT ON SCHEMA `+ident+` IS '`+demoMark+`'`)
		return err
	})
	if err != nil && !errors.Is(err, ErrNotDemoSchema) {
		return fmt.Errorf("reset demo schema %s: %w", schema, err)
	}
	return err
}

// leftByOlderDemo recognises a schema an older demo made, before it marked
// its schemas: nothing in it but Projector's own relations and the
// helpdesk's (tables, their indexes and sequences), and no functions but
// Projector's own (its migrations' triggers). Any other object makes it
// someone else's.
func leftByOlderDemo(ctx context.Context, tx pgx.Tx, schema string) bool {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT bool_and(c.relname LIKE 'projector\_%' OR c.relname LIKE 'helpdesk\_%')
			AND bool_or(c.relname = 'projector_migrations') AND bool_or(c.relname LIKE 'helpdesk\_%')
			AND NOT EXISTS (SELECT 1 FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.proname NOT LIKE 'projector\_%')
		FROM pg_class c WHERE c.relnamespace = $1::regnamespace`, schema).Scan(&ok)
	return err == nil && ok
}

// catchUp runs the dispatcher until every consumer has applied everything,
// drawing progress, then stops it.
func catchUp(ctx context.Context, store *postgres.Store, app *App, out io.Writer, progress bool) error {
	// A per-instance consumer and a fixed instance id: the demo's dispatcher
	// is the only one.
	d, err := projection.New(projection.Config{Store: store, Projections: app.Async(), InstanceID: "demo",
		Logger: quietLogger(out)})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = d.Stop(context.WithoutCancel(ctx)) }()
	admin := projection.NewAdmin(store)
	var total int64
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_events")).Scan(&total); err != nil {
		return err
	}
	var bar *progressbar.ProgressBar
	done := make(chan error, 1)
	go func() { done <- d.CatchUp(ctx) }()
	fmt.Fprintln(out, "\n== Dispatcher catching up")
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			shards, err := admin.List(ctx, "")
			if err != nil {
				return err
			}
			var applied int64
			for _, s := range shards {
				applied += s.Processed
			}
			fmt.Fprintf(out, "\n%d consumers caught up: %d events applied in total\n", len(shards), applied)
			return nil
		case <-tick.C:
			if !progress {
				continue
			}
			shards, err := admin.List(ctx, "")
			if err != nil || len(shards) == 0 {
				continue
			}
			// Progress is how far the cursors are through the log: every
			// shard moves from total events behind to none.
			var behind int64
			for _, s := range shards {
				behind += min(s.LagEvents, total)
			}
			if bar == nil {
				bar = progressbar.NewOptions64(total*int64(len(shards)), progressbar.OptionSetWriter(out),
					progressbar.OptionSetDescription(fmt.Sprintf("%d consumers through %d events", len(shards), total)),
					progressbar.OptionSetWidth(30), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionShowElapsedTimeOnFinish())
			}
			_ = bar.Set64(total*int64(len(shards)) - behind)
		}
	}
}

type simulation struct {
	store   *postgres.Store
	tickets *aggregate.Repository[Ticket]
	cfg     DemoConfig

	commands, events, refused, retries atomic.Int64

	mu     sync.Mutex
	opened []string
}

func (s *simulation) run(ctx context.Context) error {
	for _, c := range customers {
		if err := s.append(ctx, projector.Stream(CustomerStream, c), projector.NoStream, CustomerRegistered{Name: c, Email: c + "@example.com"}); err != nil {
			return err
		}
	}
	for _, a := range agents {
		if err := s.append(ctx, projector.Stream(AgentStream, a), projector.NoStream, AgentJoined{Name: a}); err != nil {
			return err
		}
	}
	var next atomic.Int64
	errs := make(chan error, s.cfg.Users)
	var wg sync.WaitGroup
	for u := range s.cfg.Users {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(u)))
			for range s.cfg.Actions {
				if err := s.act(ctx, rng, u, &next); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs, ctx.Err())
}

// act sends one command as user u: the even users are customers who open
// and comment on tickets, the odd ones agents who assign, comment, close and
// ping. Several users often pick the same ticket at once: the aggregate's
// optimistic concurrency refuses the loser, which Handle retries on fresh
// state.
func (s *simulation) act(ctx context.Context, rng *rand.Rand, u int, next *atomic.Int64) error {
	var id string
	var cmd aggregate.Decide[Ticket]
	if u%2 == 0 || len(s.snapshotOpened()) == 0 {
		customer := customers[rng.IntN(len(customers))]
		if rng.IntN(3) > 0 || len(s.snapshotOpened()) == 0 {
			id = fmt.Sprintf("T-%04d", next.Add(1))
			cmd = OpenTicket(customer, subjects[rng.IntN(len(subjects))])
		} else {
			id = s.pick(rng)
			cmd = CommentTicket(customer, "Any news?")
		}
		ctx = projector.WithActor(ctx, customer)
	} else {
		agent := agents[rng.IntN(len(agents))]
		ctx = projector.WithActor(ctx, agent)
		id = s.pick(rng)
		switch r := rng.IntN(10); {
		case r < 4:
			cmd = AssignTicket(agent)
		case r < 6:
			cmd = CommentTicket(agent, "Looking into it.")
		case r < 9:
			cmd = CloseTicket("fixed")
		default:
			return s.append(ctx, projector.Stream(SessionStream, agent), projector.AnyVersion, AgentPinged{Agent: agent})
		}
	}
	s.commands.Add(1)
	res, err := s.tickets.Handle(ctx, projector.Stream(TicketStream, id), cmd)
	s.retries.Add(int64(max(res.Attempts-1, 0)))
	switch {
	case errors.Is(err, ErrTicketExists), errors.Is(err, ErrNoTicket), errors.Is(err, ErrTicketClosed), errors.Is(err, ErrNotAssignedYet):
		s.refused.Add(1)
		return nil
	case err != nil:
		return err
	}
	s.events.Add(int64(len(res.Events)))
	if res.Loaded.Version == 1 && len(res.Events) == 1 {
		s.mu.Lock()
		s.opened = append(s.opened, id)
		s.mu.Unlock()
	}
	return nil
}

func (s *simulation) snapshotOpened() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opened
}

// pick returns a ticket, favouring recent ones so users collide.
func (s *simulation) pick(rng *rand.Rand) string {
	opened := s.snapshotOpened()
	n := len(opened)
	return opened[max(0, n-1-rng.IntN(min(n, 20)))]
}

// append appends payloads to stream in a transaction of its own.
//
// Two users pinging one agent's session stream at once can collide even with
// AnyVersion: an append from an older transaction after a younger one is
// refused (promise 4) with the retryable ErrConcurrency, so it is retried.
func (s *simulation) append(ctx context.Context, stream projector.StreamRef, exp projector.ExpectedVersion, payloads ...any) error {
	var err error
	for range 5 {
		err = pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
			_, err := s.store.Append(ctx, tx, stream, exp, payloads...)
			return err
		})
		if !errors.Is(err, projector.ErrConcurrency) {
			break
		}
		s.retries.Add(1)
	}
	if err == nil {
		s.events.Add(int64(len(payloads)))
	}
	return err
}

// report prints the read models.
func report(ctx context.Context, store *postgres.Store, app *App, tickets *aggregate.Repository[Ticket], out io.Writer) error {
	q := func(name string) string { return pgx.Identifier{store.Schema(), name}.Sanitize() }
	fmt.Fprintf(out, "\n== Tickets (inline projection ticket_summary: committed with the events)\n")
	rows, err := store.Pool().Query(ctx, `SELECT status, count(*) FROM `+q(SummaryTable)+` GROUP BY status ORDER BY status`)
	if err != nil {
		return err
	}
	var status string
	var n int
	var parts []string
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error { parts = append(parts, fmt.Sprintf("%s %d", status, n)); return nil }); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n", strings.Join(parts, ", "))

	fmt.Fprintf(out, "\n== Agent workload (async projection agent_workload, per-event handlers)\n")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGENT\tOPEN\tCLOSED")
	rows, err = store.Pool().Query(ctx, `SELECT agent, open, closed FROM `+q(WorkloadTable)+` ORDER BY agent`)
	if err != nil {
		return err
	}
	var agent string
	var open, closed int
	if _, err := pgx.ForEachRow(rows, []any{&agent, &open, &closed}, func() error {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", agent, open, closed)
		return nil
	}); err != nil {
		return err
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n== Customer history (async projection customer_history, one set-based write per batch)\n")
	rows, err = store.Pool().Query(ctx, `SELECT customer, count(DISTINCT ticket_id), count(*) FROM `+q(HistoryTable)+` GROUP BY customer ORDER BY customer`)
	if err != nil {
		return err
	}
	var customer string
	var nTickets, nEvents int
	if _, err := pgx.ForEachRow(rows, []any{&customer, &nTickets, &nEvents}, func() error {
		fmt.Fprintf(out, "%-9s %3d tickets, %4d events\n", customer, nTickets, nEvents)
		return nil
	}); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n== Live counter (per-instance consumer live_counter, in memory, from committed batches)\n")
	counts := app.Counter.Counts()
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range counts {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		fmt.Fprintf(out, "%-20s %d\n", name, counts[name])
	}

	first := projector.Stream(TicketStream, "T-0001")
	now, err := tickets.Load(ctx, first)
	if err != nil {
		return err
	}
	then, err := tickets.LoadVersion(ctx, first, 1)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== Time travel (aggregate ticket)\nT-0001 now (v%d): %s, %s, agent %q, %d comments\nT-0001 as of v1:  %s, %s\n",
		now.Version, now.State.Subject, now.State.Status, now.State.Agent, now.State.Comments, then.State.Subject, then.State.Status)
	return nil
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// quietLogger keeps the dispatcher's info lines out of the demo's output;
// warnings and errors still show, on standard error.
func quietLogger(io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// catchUpWith runs a dispatcher of projs on store until it has applied
// every event there is, then stops it: how each demo section that adds a
// consumer (search, relay) brings it up to date.
func catchUpWith(ctx context.Context, store *postgres.Store, out io.Writer, projs ...*projection.Async) error {
	d, err := projection.New(projection.Config{Store: store, Projections: projs, InstanceID: "demo", Logger: quietLogger(out)})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	err = d.CatchUp(ctx)
	if stopErr := d.Stop(context.WithoutCancel(ctx)); err == nil {
		err = stopErr
	}
	return err
}

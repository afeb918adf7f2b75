package helpdesk

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// DemoConfig sizes the demo.
type DemoConfig struct {
	// Schema is where the demo's tables go; it is dropped and recreated.
	// Default "projector_demo".
	Schema string
	// Tickets is how many tickets simulated customers open; default 300.
	Tickets int
	// Users is how many simulated users work at once; default 8.
	Users int
	// Seed makes a run repeatable; default 1.
	Seed uint64
}

// RunDemo resets the demo schema, migrates it, has simulated customers and
// agents work through tickets concurrently, then reads the log back and
// prints what happened to out.
func RunDemo(ctx context.Context, pool *pgxpool.Pool, out io.Writer, cfg DemoConfig) error {
	cfg.Schema = cmp.Or(cfg.Schema, "projector_demo")
	cfg.Tickets = cmp.Or(cfg.Tickets, 300)
	cfg.Users = cmp.Or(cfg.Users, 8)
	cfg.Seed = cmp.Or(cfg.Seed, 1)
	if err := postgres.ValidateSchema(cfg.Schema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{cfg.Schema}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("reset demo schema: %w", err)
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
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: cfg.Schema, Registry: types.Registry})
	if err != nil {
		return err
	}
	sim := &simulation{store: store, cfg: cfg}
	if err := sim.run(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d simulated users appended %d events (%d version conflicts retried)\n", cfg.Users, sim.appended, sim.conflicts)
	return report(ctx, store, out)
}

var (
	customers = []string{"ada", "grace", "linus", "barbara", "ken", "margaret"}
	agents    = []string{"alice", "bob", "carol"}
)

type simulation struct {
	store *postgres.Store
	cfg   DemoConfig

	mu                  sync.Mutex
	appended, conflicts int
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
	work := make(chan int)
	errs := make(chan error, s.cfg.Users)
	var wg sync.WaitGroup
	for u := range s.cfg.Users {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(u)))
			for n := range work {
				if err := s.ticketLife(ctx, rng, n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() {
		defer close(work)
		for n := range s.cfg.Tickets {
			select {
			case work <- n:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// ticketLife plays one ticket from opening to (usually) closing, each step
// its own transaction with an exact expected version.
func (s *simulation) ticketLife(ctx context.Context, rng *rand.Rand, n int) error {
	id := fmt.Sprintf("T-%04d", n+1)
	customer := customers[rng.IntN(len(customers))]
	agent := agents[rng.IntN(len(agents))]
	steps := []any{
		TicketOpened{Customer: customer, Subject: subjects[rng.IntN(len(subjects))]},
		TicketAssigned{Agent: agent},
	}
	for range rng.IntN(4) {
		steps = append(steps, TicketCommented{Author: agent, Body: "Looking into it."})
	}
	if rng.IntN(5) > 0 {
		steps = append(steps, TicketClosed{Resolution: "fixed"})
	}
	ctx = projector.WithActor(ctx, customer)
	for v, ev := range steps {
		if err := s.append(ctx, projector.Stream(TicketStream, id), projector.ExactVersion(int64(v)), ev); err != nil {
			return err
		}
	}
	return nil
}

var subjects = []string{"printer on fire", "cannot log in", "invoice is wrong", "feature request: dark mode", "password reset"}

func (s *simulation) append(ctx context.Context, stream projector.StreamRef, exp projector.ExpectedVersion, payloads ...any) error {
	err := pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
		_, err := s.store.Append(ctx, tx, stream, exp, payloads...)
		return err
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.appended += len(payloads)
	s.mu.Unlock()
	return nil
}

func report(ctx context.Context, store *postgres.Store, out io.Writer) error {
	counts := map[string]int{}
	after := projector.Start
	total := 0
	for {
		b, err := store.ReadLog(ctx, postgres.LogQuery{After: after, Limit: 1000})
		if err != nil {
			return err
		}
		for _, ev := range b.Events {
			counts[ev.Type]++
		}
		total += len(b.Events)
		after = b.Next(after)
		if !b.Full {
			break
		}
	}
	fmt.Fprintf(out, "\nread back %d events from the log:\n", total)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, name := range store.Registry().Names() {
		fmt.Fprintf(w, "  %s\t%d\n", name, counts[name])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	evs, err := store.ReadStream(ctx, projector.Stream(TicketStream, "T-0001"), postgres.StreamQuery{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nstream ticket/T-0001:\n")
	for _, ev := range evs {
		fmt.Fprintf(out, "  v%d  %-17s %s\n", ev.Version, ev.Type, ev.Data)
	}
	return nil
}

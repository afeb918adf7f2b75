package projection_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A handler that loses a conflict with another transaction (here a real
// deadlock's victim) in a live pass has not failed on its event: the pass
// rolls back with nothing recorded against the event and runs again. It
// used to be recorded as the event's failure: with MaxAttempts 1 a halting
// consumer went dead, a continuous one dead-lettered the healthy event at
// once and a parking one parked its stream. A handler whose emitted events
// lose it (the append reports projector.ErrConcurrency) is no different.
//
// The deadlock is made as in TestDeadLetterRetryHereOutlivesADeadlock: the
// test holds the table the handler writes, the pass (holding its shard's
// lock) waits for it, then the test waits for the shard's lock, and the
// pass's backend, with the shorter deadlock_timeout, is the victim.
func TestHandlerLosingADeadlockIsNotTheEventsFailure(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		cfg  projection.AsyncConfig
	}{
		{"halt", projection.AsyncConfig{MaxAttempts: 1}},
		{"continuous", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1}},
		{"park", projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.traceTable()
			p := poisoned(e, "conflicted", mode.cfg, &atomic.Bool{})
			ev := e.appendOne("s", projector.NoStream, testevents.TicketOpened{Title: "healthy"})[0]
			e.loseADeadlock(p, e.table("trace"), ev)
			if n := e.traced("conflicted", ev.ID); n != 1 {
				t.Fatalf("the event was applied %d times, want 1", n)
			}
		})
	}
	t.Run("emitting", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		p := projection.NewAsync("conflicted", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1})
		must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketOpened) error {
			_, err := projection.Emit(ctx, tx, projector.Stream("emitted", ev.Stream.ID), projector.AnyVersion, testevents.TicketCommented{Body: "emitted"})
			return err
		}))
		ev := e.appendOne("s", projector.NoStream, testevents.TicketOpened{Title: "healthy"})[0]
		e.loseADeadlock(p, e.store.Table("projector_events"), ev)
		emitted, err := e.store.ReadStream(e.ctx, projector.Stream("emitted", "s"), postgres.StreamQuery{})
		if err != nil || len(emitted) != 1 || emitted[0].Metadata.CausationID != ev.ID {
			t.Fatalf("emitted %+v, %v; want the one event caused by %s", emitted, err, ev.ID)
		}
	})
}

// loseADeadlock runs p's dispatcher over ev, whose handler writes table,
// makes the pass the victim of a deadlock, checks that nothing was
// recorded against the event, then lets the dispatcher catch up and checks
// again.
func (e *env) loseADeadlock(p *projection.Async, table string, ev projector.Event) {
	t := e.t
	t.Helper()
	tx, holder := pgtest.HoldForDeadlock(t, e.store.Pool(), table)
	defer func() { _ = tx.Rollback(e.ctx) }()
	reg := prometheus.NewRegistry()
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg})
	pgtest.WaitForLockOn(t, e.store.Pool(), table) // the pass holds its shard's lock and waits for table
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: p.Name()}); err != nil {
		t.Fatalf("the test's side of the deadlock (backend %d): %v; want the pass aborted", holder, err)
	}
	// The pass lost and its transaction ended: whatever it recorded has
	// committed.
	admin := projection.NewAdmin(e.store)
	check := func(when string) {
		t.Helper()
		st := e.status(admin, p.Name())
		if st.Status == projection.StatusDead || st.Attempts != 0 || st.LastError != "" {
			t.Fatalf("%s: shard %s, %d attempts, error %q; want no failure recorded", when, st.Status, st.Attempts, st.LastError)
		}
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: p.Name()})
		if err != nil {
			t.Fatal(err)
		}
		parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: p.Name()})
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 0 || len(parks) != 0 {
			t.Fatalf("%s: %d dead letters %+v, %d parks %+v; want none", when, len(dls), dls, len(parks), parks)
		}
	}
	check("after the deadlock")
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	check("after catching up")
	// Counted where operators look for a shard that keeps losing.
	if n := counterSum(t, reg, "projector_handler_conflicts_total"); n < 1 {
		t.Fatalf("projector_handler_conflicts_total %v after the lost pass, want at least 1", n)
	}
	if n := counterSum(t, reg, "projector_events_failed_total"); n != 0 {
		t.Fatalf("projector_events_failed_total %v, want 0: a lost conflict is not a failure", n)
	}
	if st := e.status(admin, p.Name()); st.Cursor.Less(ev.Position) {
		t.Fatalf("cursor %s, want at or past the event %s", st.Cursor, ev.Position)
	}
}

// counterSum is the sum of the counter name's series in reg.
func counterSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

package saga_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// A timeout step that loses a conflict with another transaction (here a
// real deadlock's victim, saving the step) is not the step's failure: it
// stays due with no attempt counted, and fires on the next round. It used
// to count as an attempt; with TimeoutAttempts 1 the instance failed.
//
// The deadlock: the test holds the saga's step table in SHARE mode, so the
// round, holding the claimed timeout's row, waits at the step's record;
// the test then asks for that row with a far longer deadlock_timeout, so
// the round's backend is the victim.
//
// The rounds run on one connection. "at the step": a first round (t0's
// timeout) leaves the step's statements prepared on it, so the deadlock
// strikes the step's execution, under its savepoint; the round commits the
// rest and returns no error. "before the savepoint": nothing is prepared,
// the deadlock strikes the preparation of the step's batch (which takes
// the same lock) before its savepoint is set, the transaction is aborted,
// and the round says it lost a conflict and recorded nothing (it used to
// say the savepoint did not exist).
func TestSagaTimeoutLosingADeadlockIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{true, false} {
		name := "at the step"
		if !warm {
			name = "before the savepoint"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			timeoutLosesADeadlock(t, warm)
		})
	}
}

func timeoutLosesADeadlock(t *testing.T, warm bool) {
	e := newEnv(t)
	clk := newClock()
	s := saga.New[slaState]("reminder", saga.Config{Now: clk.Now, TimeoutAttempts: 1})
	must(saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, _ testevents.TicketOpened) error {
		in.After("remind", time.Minute)
		return nil
	}))
	must(saga.OnTimeout(s, "remind", func(_ context.Context, in *saga.Instance[slaState], _ saga.Timeout) error {
		in.State.Reminded++
		in.Complete()
		return nil
	}))
	d := e.dispatcher(s, projection.Config{})
	cfg := pgtest.PoolConfig(t)
	cfg.MaxConns = 1
	one, err := postgres.New(e.ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: e.store.Schema(), Registry: e.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	r, err := saga.NewRunner(saga.RunnerConfig{Store: one, Sagas: []saga.Definition{s}})
	if err != nil {
		t.Fatal(err)
	}
	if warm {
		e.append(projector.Stream("ticket", "t0"), testevents.TicketOpened{Title: "a"})
		e.catchUp(d)
		clk.Advance(time.Minute)
		if n := e.fire(r); n != 1 {
			t.Fatalf("first round: fired %d, want t0's timeout", n)
		}
	}
	e.append(projector.Stream("ticket", "t1"), testevents.TicketOpened{Title: "b"})
	e.catchUp(d)
	clk.Advance(time.Minute)

	tx, _ := pgtest.HoldForDeadlock(t, e.store.Pool(), e.store.Table("projector_saga_steps"))
	type round struct {
		n   int
		err error
	}
	done := make(chan round, 1)
	go func() {
		n, err := r.FireDue(e.ctx)
		done <- round{n, err}
	}()
	pgtest.WaitForLockOn(t, e.store.Pool(), e.store.Table("projector_saga_steps")) // the round holds the timeout's row and waits at the step's record
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+e.store.Table("projector_saga_timeouts")+` FOR UPDATE`); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the round aborted", err)
	}
	got := <-done
	if warm && (got.n != 0 || got.err != nil) {
		t.Fatalf("the deadlocked round: fired %d, %v; want nothing fired, no error", got.n, got.err)
	}
	if !warm && (got.n != 0 || got.err == nil || !strings.Contains(got.err.Error(), "lost a conflict, the round is rolled back with nothing recorded")) {
		t.Fatalf("the deadlocked round: fired %d, %v; want nothing fired, the conflict reported", got.n, got.err)
	}
	in, err := saga.Show(e.ctx, e.store, "reminder", projector.SystemTenant, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.Active || len(in.Timeouts) != 1 || in.Timeouts[0].Attempts != 0 || in.Timeouts[0].LastError != "" {
		t.Fatalf("after the deadlock: %+v; want the instance active, its timeout due, no attempt", in)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d on the next round, want 1", n)
	}
	in, err = saga.Show(e.ctx, e.store, "reminder", projector.SystemTenant, "t1")
	var st struct{ Reminded int }
	if err == nil {
		err = json.Unmarshal(in.State, &st)
	}
	if err != nil || in.Status != saga.Completed || st.Reminded != 1 {
		t.Fatalf("after the next round: %+v, %v; want it completed, reminded once", in, err)
	}
}

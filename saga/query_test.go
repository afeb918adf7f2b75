package saga_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// Summaries counts a saga's instances by status and its pending timeouts,
// of which those due by the database's clock and not fired are overdue;
// List and Show give each instance's next timeout, and ShowID finds an
// instance by id only under its own saga's name.
func TestSagaSummariesAndShowID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The saga's clock is the wall clock, set back two hours for the first
	// opening: its reminder, an hour later, was due an hour ago.
	clk := &clock{t: time.Now().Add(-2 * time.Hour)}
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})
	e.append(projector.Stream("ticket", "late"), testevents.TicketOpened{Title: "nobody answered"})
	e.catchUp(d)
	clk.Advance(2 * time.Hour)
	e.append(projector.Stream("ticket", "waiting"), testevents.TicketOpened{Title: "fresh"})
	e.append(projector.Stream("ticket", "assigned"), testevents.TicketOpened{Title: "taken"})
	e.append(projector.Stream("agent", "ann"), Assigned{Ticket: "assigned", Agent: "ann"})
	e.append(projector.Stream("ticket", "done"), testevents.TicketOpened{Title: "quick"}, testevents.TicketClosed{})
	e.catchUp(d)

	sums, err := saga.Summaries(e.ctx, e.store)
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != 1 {
		t.Fatalf("summaries %+v: want one, of sla", sums)
	}
	got := sums[0]
	if got.Saga != "sla" || got.Active != 3 || got.Completed != 1 || got.Failed != 0 || got.Instances() != 4 ||
		got.PendingTimeouts != 2 || got.OverdueTimeouts != 1 {
		t.Fatalf("summary %+v: want 3 active, 1 completed, 2 pending timeouts of which 1 overdue", got)
	}
	if age := time.Since(got.OldestOverdueAt); age < 50*time.Minute || age > 70*time.Minute {
		t.Fatalf("oldest overdue timeout due %v ago, want about an hour", age)
	}
	if only, err := saga.Summaries(e.ctx, e.store, "sla", "other"); err != nil || len(only) != 1 || only[0] != got {
		t.Fatalf("summaries of sla and other: %+v, %v; want sla's alone", only, err)
	}
	if none, err := saga.Summaries(e.ctx, e.store, "other"); err != nil || len(none) != 0 {
		t.Fatalf("summaries of a saga without instances: %+v, %v; want none", none, err)
	}
	// A name PostgreSQL cannot compare: refused before it is sent (the
	// driver's SQLSTATE 22021 came back: an API audit).
	if _, err := saga.Summaries(e.ctx, e.store, "sla", "a\x00b"); !errors.Is(err, saga.ErrInvalidArgument) {
		t.Fatalf("summaries of a name with a NUL: %v; want ErrInvalidArgument", err)
	}

	list, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla"})
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]time.Time{}
	for _, in := range list {
		next[in.Key] = in.NextTimeoutAt
	}
	if len(next) != 4 || !next["assigned"].IsZero() || !next["done"].IsZero() ||
		!next["late"].Before(time.Now()) || !next["waiting"].After(time.Now()) {
		t.Fatalf("next timeouts %v: want late's past, waiting's ahead, none for assigned and done", next)
	}

	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "late")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Timeouts) != 1 || !in.NextTimeoutAt.Equal(in.Timeouts[0].DueAt) {
		t.Fatalf("show: next timeout %v, timeouts %+v", in.NextTimeoutAt, in.Timeouts)
	}
	byID, err := saga.ShowID(e.ctx, e.store, "sla", in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if byID.Key != "late" || byID.ID != in.ID || len(byID.Steps) != len(in.Steps) || len(byID.Timeouts) != 1 {
		t.Fatalf("show by id: %+v; want the instance Show found, %+v", byID, in)
	}
	for _, c := range []struct {
		saga string
		id   uuid.UUID
	}{{"other", in.ID}, {"sla", uuid.New()}} {
		if _, err := saga.ShowID(e.ctx, e.store, c.saga, c.id); !errors.Is(err, projector.ErrNotFound) {
			t.Errorf("show %s %s: %v, want ErrNotFound", c.saga, c.id, err)
		}
	}
}

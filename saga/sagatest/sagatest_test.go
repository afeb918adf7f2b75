package sagatest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/saga/sagatest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type Reminded struct {
	Ticket string `json:"ticket"`
}

type state struct {
	Title    string
	Comments int
	Reminded int
}

// reminder: opened starts it and schedules "remind" in an hour; a comment
// pushes the reminder back an hour ("past" schedules one in the past, a
// refused step); the reminder appends Reminded; a close completes it.
func reminder(reg *projector.Registry, ty testevents.Types, now func() time.Time) *saga.Saga[state] {
	projector.MustDefine[Reminded](reg, "sla.reminded")
	s := saga.New[state]("reminder", saga.Config{Now: now})
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, e testevents.TicketOpened) error {
		in.State.Title = e.Title
		in.After("remind", time.Hour)
		return nil
	}))
	must(saga.On(s, ty.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, e testevents.TicketCommented) error {
		in.State.Comments++
		if e.Body == "past" {
			in.Schedule("remind", in.Now().Add(-time.Minute))
			return nil
		}
		in.After("remind", time.Hour)
		return nil
	}))
	must(saga.On(s, ty.Closed, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketClosed) error {
		in.Complete()
		return nil
	}))
	must(saga.OnTimeout(s, "remind", func(_ context.Context, in *saga.Instance[state], _ saga.Timeout) error {
		in.State.Reminded++
		in.Append(projector.Stream("sla", in.Key()), projector.AnyVersion, Reminded{Ticket: in.Key()})
		return nil
	}))
	return s
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// The fixture, without a database: the timeout is pending at the right
// time, does not fire a moment early, fires once, is pushed back by a
// comment, and a completed instance counts late events and has no
// timeouts. A refused step changes nothing.
func TestFixture(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	f := sagatest.New(t, reminder(ty.Registry, ty, nil), ty.Registry)
	ticket := projector.Stream("ticket", "t-1")

	f.Given(ticket, testevents.TicketOpened{Title: "printer"}).
		ExpectState("t-1", state{Title: "printer"}).
		ExpectTimeouts("t-1", map[string]time.Time{"remind": sagatest.Start.Add(time.Hour)}).
		ExpectAppended()
	f.Advance(time.Hour - time.Nanosecond).ExpectAppended()
	f.Advance(time.Nanosecond).ExpectAppended(Reminded{Ticket: "t-1"}).
		ExpectState("t-1", state{Title: "printer", Reminded: 1}).
		ExpectTimeouts("t-1", nil)

	f.Given(ticket, testevents.TicketCommented{Body: "hi"}).Advance(30 * time.Minute)
	f.Given(ticket, testevents.TicketCommented{Body: "again"}) // pushes the reminder to +1h from now
	f.Advance(59 * time.Minute).ExpectAppended()
	f.Advance(time.Minute).ExpectAppended(Reminded{Ticket: "t-1"})

	err := f.Deliver(ticket, testevents.TicketCommented{Body: "past"})
	if !errors.Is(err, saga.ErrInvalidStep) {
		t.Fatalf("timeout in the past: %v, want ErrInvalidStep", err)
	}
	f.ExpectState("t-1", state{Title: "printer", Comments: 2, Reminded: 2})

	f.Given(ticket, testevents.TicketClosed{}, testevents.TicketCommented{Body: "late"}).
		ExpectStatus("t-1", saga.Completed).ExpectTimeouts("t-1", nil)
	f.Given(projector.Stream("ticket", "other"), testevents.TicketCommented{Body: "no instance"})
	if f.Late() != 1 || f.Ignored() != 1 {
		t.Fatalf("late %d, ignored %d; want 1 and 1", f.Late(), f.Ignored())
	}
	f.Advance(48 * time.Hour).ExpectAppended()
}

// A fixture and a projection spec on one clock agree on the time: what
// one moves, the other sees, and the fixture's timeouts fire by it.
func TestFixture_SharedClock(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	clock := projectiontest.NewClock(sagatest.Start)
	f := sagatest.New(t, reminder(ty.Registry, ty, nil), ty.Registry).UseClock(clock)
	m := projectiontest.NewMemory(t, projectiontest.MemoryConfig[[]time.Time]{Registry: ty.Registry, Clock: clock,
		Fold: func(m []time.Time, ev projector.Event) ([]time.Time, error) { return append(m, ev.RecordedAt), nil }})
	ticket := projector.Stream("ticket", "t-1")

	clock.Advance(time.Hour)
	f.Given(ticket, testevents.TicketOpened{Title: "printer"}).
		ExpectTimeouts("t-1", map[string]time.Time{"remind": sagatest.Start.Add(2 * time.Hour)})
	m.Given(ticket, testevents.TicketOpened{Title: "printer"})
	f.Advance(time.Hour).ExpectAppended(Reminded{Ticket: "t-1"})
	m.Given(ticket, testevents.TicketClosed{}).
		ThenModel([]time.Time{sagatest.Start.Add(time.Hour), sagatest.Start.Add(2 * time.Hour)})
	if f.Clock() != clock || !f.Now().Equal(sagatest.Start.Add(2*time.Hour)) {
		t.Fatalf("fixture clock at %v, want the shared clock at %v", f.Now(), sagatest.Start.Add(2*time.Hour))
	}
}

// Run drives the same saga against a real database with an injected
// clock: Settle handles the events and fires what fell due.
func TestRun(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	clock := projectiontest.NewClock(sagatest.Start)
	s := reminder(ty.Registry, ty, clock.Now)
	store := pgtest.Store(t, ty.Registry)
	live := sagatest.Run(t, store, s)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t-1"), projector.AnyVersion, testevents.TicketOpened{Title: "x"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	live.Settle(ctx)
	clock.Advance(2 * time.Hour)
	live.Settle(ctx)
	in, err := saga.Show(ctx, store, "reminder", projector.SystemTenant, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Version != 2 || len(in.Appended) != 1 || in.Appended[0].Type != "sla.reminded" || len(in.Timeouts) != 0 {
		t.Fatalf("instance %+v: want the opened step and one reminder", in)
	}
}

// A saga driven by a tenant's streams is inspected with InTenant: before,
// State and the Expect methods looked up the system tenant's instances
// only, and failed with "no instance for key" for one that existed in its
// tenant. Without InTenant the failure names the tenant that has it.
func TestFixture_InTenant(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	f := sagatest.New(t, reminder(ty.Registry, ty, nil), ty.Registry)
	f.Given(projector.TenantStream("acme", "ticket", "t-1"), testevents.TicketOpened{Title: "acme's"}).
		Given(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "the system's"})
	f.InTenant("acme").ExpectState("t-1", state{Title: "acme's"}).
		ExpectTimeouts("t-1", map[string]time.Time{"remind": sagatest.Start.Add(time.Hour)})
	f.InTenant(projector.SystemTenant).ExpectState("t-1", state{Title: "the system's"})

	ty2 := testevents.New()
	rec := &fatalRecorder{TB: t}
	g := sagatest.New(rec, reminder(ty2.Registry, ty2, nil), ty2.Registry)
	g.Given(projector.TenantStream("acme", "ticket", "t-2"), testevents.TicketOpened{Title: "acme's"})
	func() {
		defer func() {
			if r := recover(); r != nil && r != errFatal {
				panic(r)
			}
		}()
		g.State("t-2")
	}()
	if !strings.Contains(rec.msg, `no instance for key "t-2" in tenant __system__; it has one in acme: look there with InTenant`) {
		t.Fatalf("looking up another tenant's instance: %q", rec.msg)
	}
}

// fatalRecorder keeps a fixture's Fatalf message and stops its caller with
// errFatal instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

var errFatal = errors.New("fatal recorded")

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(errFatal)
}

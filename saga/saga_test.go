package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// A saga driven by events of several streams (tickets, agents) reaches the
// expected state and appends the expected events, each with the handled
// event's id as causation and the instance's correlation id.
func TestSagaStepsAcrossStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})

	corr := uuid.New()
	ctx := projector.WithCorrelationID(e.ctx, corr)
	e.ctx = ctx
	opened := e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "printer"})
	e.ctx = context.Background()
	c1 := e.append(projector.Stream("ticket", "t-1"), testevents.TicketCommented{Body: "hello"})
	e.append(projector.Stream("agent", "ann"), Assigned{Ticket: "t-1", Agent: "ann"})
	c2 := e.append(projector.Stream("ticket", "t-1"), testevents.TicketCommented{Body: "again"})
	e.catchUp(d)

	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	var st slaState
	if err := json.Unmarshal(in.State, &st); err != nil {
		t.Fatal(err)
	}
	want := slaState{Title: "printer", Comments: 2, Agent: "ann"}
	if st != want || in.Status != saga.Active || in.Version != 4 || in.CorrelationID != corr {
		t.Fatalf("instance = %+v, state %+v; want active, version 4, correlation %s, state %+v", in, st, corr, want)
	}
	if len(in.Timeouts) != 0 {
		t.Fatalf("timeouts %+v: the assignment should have cancelled the reminder", in.Timeouts)
	}
	if len(in.Steps) != 4 || in.Steps[0].CauseID != opened.Events[0].ID || in.Steps[0].Type != "ticket.opened" {
		t.Fatalf("steps %+v: want 4, the first caused by the opened event", in.Steps)
	}
	notes, err := e.store.ReadStream(e.ctx, projector.Stream("sla", "t-1"), postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 2 {
		t.Fatalf("sla stream has %d events, want 2 notes", len(notes))
	}
	for i, cause := range []uuid.UUID{c1.Events[0].ID, c2.Events[0].ID} {
		n := notes[i]
		if n.Type != "sla.noted" || n.Metadata.CausationID != cause || n.Metadata.CorrelationID != corr {
			t.Errorf("note %d: %s causation %s correlation %s; want sla.noted caused by %s, correlation %s",
				i, n.Type, n.Metadata.CausationID, n.Metadata.CorrelationID, cause, corr)
		}
		if p := n.Payload.(Noted); p.N != i+1 {
			t.Errorf("note %d has N %d", i, p.N)
		}
	}
	if len(in.Appended) != 2 {
		t.Errorf("show lists %d appended events, want 2", len(in.Appended))
	}
}

// Late events after completion are ignored and counted, on the instance and
// in the saga's counter; an event of no instance that may not start one is
// ignored and counted too; a completed instance's timeouts never fire.
func TestSagaLateAndIgnoredEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})
	r := e.runner(s)

	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "x"}, testevents.TicketClosed{})
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketCommented{Body: "late"}, testevents.TicketCommented{Body: "later"})
	e.append(projector.Stream("ticket", "nobody"), testevents.TicketCommented{Body: "no instance"})
	e.catchUp(d)

	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.Completed || in.LateEvents != 2 || in.Version != 2 || in.CompletedAt.IsZero() {
		t.Fatalf("instance %+v: want completed after 2 steps with 2 late events", in)
	}
	if s.Late() != 2 || s.Ignored() != 1 {
		t.Fatalf("late %d, ignored %d; want 2 and 1", s.Late(), s.Ignored())
	}
	if got := e.events("sla.noted"); got != 0 {
		t.Fatalf("%d notes appended for late events", got)
	}
	if e.pendingTimeouts() != 0 || e.instances() != 1 {
		t.Fatalf("%d pending timeouts, %d instances; want 0 and 1", e.pendingTimeouts(), e.instances())
	}
	clk.Advance(2 * time.Hour)
	if n := e.fire(r); n != 0 {
		t.Fatalf("%d timeouts fired for a completed instance", n)
	}
	if _, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "nobody"); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("show of a key with no instance: %v, want ErrNotFound", err)
	}
}

// Two start events for one key give one instance: the second start event
// is handled by the instance the first made.
func TestSagaDuplicateStartOneInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newSLA(e.types, slaOptions{now: newClock().Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "first"})
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "second"})
	e.catchUp(d)
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if e.instances() != 1 || in.Version != 2 || e.pendingTimeouts() != 1 {
		t.Fatalf("%d instances, version %d, %d timeouts; want one instance that took both steps with one (replaced) reminder",
			e.instances(), in.Version, e.pendingTimeouts())
	}
}

// Bad input is a clear error and writes nothing: an empty correlation key,
// an appended payload of an undefined type, a timeout in the past. Each
// stops the saga's consumer (halt mode) with the error, and neither an
// instance, a step nor an event of the failing step exists.
func TestSagaBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		events  []any
		stream  string
		wantErr string
	}{
		{"empty key", []any{Assigned{Ticket: "", Agent: "ann"}}, "", "empty correlation key"},
		// A key PostgreSQL cannot index: the driver's "index row requires"
		// error, the 100 kB key in the shard's last error (an API audit).
		{"key too long to store", []any{Assigned{Ticket: strings.Repeat("k", 100_000), Agent: "ann"}}, "", "is not storable"},
		{"undefined emitted type", []any{testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "bad-type"}}, "t-1", "never defined"},
		{"timeout in the past", []any{testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "past"}}, "t-1", "in the past"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			s := newSLA(e.types, slaOptions{now: newClock().Now, remindAfter: time.Hour,
				async: projection.AsyncConfig{MaxAttempts: 1, BatchSize: 1}})
			e.dispatcher(s, projection.Config{})
			stream := projector.Stream("ticket", c.stream)
			if c.stream == "" {
				// An assignment names its ticket in the payload: here none.
				stream = projector.Stream("agent", "ann")
			}
			e.append(stream, c.events...)
			e.waitFor("the saga's shard to go dead", 30*time.Second, func() bool {
				st, _ := e.shardError()
				return st == projection.StatusDead
			})
			_, msg := e.shardError()
			if !strings.Contains(msg, c.wantErr) || len(msg) > 2000 {
				t.Fatalf("shard error %.300q (%d bytes), want it to say %q, short", msg, len(msg), c.wantErr)
			}
			steps := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_saga_steps"))
			if c.stream == "" && (e.instances() != 0 || steps != 0) {
				t.Fatalf("%d instances, %d steps written for a failed start", e.instances(), steps)
			}
			if c.stream != "" && steps != 1 {
				t.Fatalf("%d steps; want only the opened step before the failing one", steps)
			}
			if n := e.events("sla.noted"); n != 0 {
				t.Fatalf("%d events appended by a failed step", n)
			}
		})
	}
}

// Registration errors: an undefined event type, a type or a timeout
// handled twice, a bad name, no start event, a clash of names on one
// dispatcher or runner. Each is ErrInvalidDefinition, at registration and
// again at binding, and nothing starts.
func TestSagaDefinitionErrors(t *testing.T) {
	t.Parallel()
	ty := newTypes()
	noop := func(context.Context, *saga.Instance[slaState], projector.Event, testevents.TicketOpened) error {
		return nil
	}

	s := saga.New[slaState]("x", saga.Config{})
	if err := saga.StartOn(s, projector.EventType[testevents.TicketOpened]{}, saga.ByStream, noop); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("zero event type: %v", err)
	}
	s = saga.New[slaState]("x", saga.Config{})
	must(saga.StartOn(s, ty.Opened, saga.ByStream, noop))
	if err := saga.On(s, ty.Opened, saga.ByStream, noop); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("type handled twice: %v", err)
	}
	if err := s.Validate(ty.Registry); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("validate keeps the registration error: %v", err)
	}
	h := func(context.Context, *saga.Instance[slaState], saga.Timeout) error { return nil }
	s = saga.New[slaState]("x", saga.Config{})
	must(saga.OnTimeout(s, "a", h))
	if err := saga.OnTimeout(s, "a", h); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("timeout handled twice: %v", err)
	}
	// A name PostgreSQL refuses, or a terminal would obey, or 100 kB: each
	// step scheduling it failed at its write (a relay and saga audit).
	for _, bad := range []string{"\xff", "a\nb", "a\x00b", strings.Repeat("t", 100_000)} {
		if err := saga.OnTimeout(saga.New[slaState]("x", saga.Config{}), bad, h); !errors.Is(err, saga.ErrInvalidDefinition) || len(err.Error()) > 500 {
			t.Errorf("timeout name %.20q: %.200v; want ErrInvalidDefinition", bad, err)
		}
	}
	// A deadline past year 9999 is a mistake of the step, not the driver's
	// "timestamp out of range" at the write.
	st := saga.New[slaState]("x", saga.Config{})
	must(saga.StartOn(st, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, _ testevents.TicketOpened) error {
		in.Schedule("remind", time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC))
		return nil
	}))
	must(saga.OnTimeout(st, "remind", h))
	ev := projector.Event{Type: ty.Opened.Name(), Stream: projector.Stream("ticket", "t"), Payload: testevents.TicketOpened{Title: "x"}}
	if _, err := st.Decide(context.Background(), nil, saga.Snapshot[slaState]{}, true, ev, time.Now()); !errors.Is(err, saga.ErrInvalidStep) {
		t.Errorf("a timeout in the year 300000: %v; want ErrInvalidStep", err)
	}
	if err := saga.New[slaState]("Bad Name", saga.Config{}).Validate(ty.Registry); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("bad name: %v", err)
	}
	s = saga.New[slaState]("x", saga.Config{})
	must(saga.On(s, ty.Commented, saga.ByStream, func(context.Context, *saga.Instance[slaState], projector.Event, testevents.TicketCommented) error {
		return nil
	}))
	if err := s.Validate(ty.Registry); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("no start event: %v", err)
	}
	other := newTypes() // another registry: its types are not in ty's
	s = saga.New[slaState]("x", saga.Config{})
	must(saga.StartOn(s, other.Opened, saga.ByStream, noop))
	must(saga.On(s, other.Noted, saga.ByStream, func(context.Context, *saga.Instance[slaState], projector.Event, Noted) error { return nil }))
	reg := projector.NewRegistry()
	projector.MustDefine[testevents.TicketOpened](reg, "ticket.opened")
	if err := s.Validate(reg); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("type the registry does not define: %v", err)
	}
	if err := saga.New[slaState]("x", saga.Config{Async: projection.AsyncConfig{Delivery: projection.PerInstance}}).Err(); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("per-instance delivery: %v", err)
	}

	e := newEnv(t)
	a, b := newSLA(e.types, slaOptions{remindAfter: time.Hour}), newSLA(e.types, slaOptions{remindAfter: time.Hour})
	pa, err := a.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{pa, pb}}); !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Errorf("two sagas named sla on one dispatcher: %v", err)
	}
	if _, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{a, b}}); !errors.Is(err, saga.ErrInvalidDefinition) {
		t.Errorf("two sagas named sla on one runner: %v", err)
	}
	if e.instances() != 0 {
		t.Fatal("a refused definition wrote instances")
	}
}

// The typed handler sees the wrong payload type as an error, never a panic
// (a payload the registry decoded into another type).
func TestSagaDecideWrongPayload(t *testing.T) {
	t.Parallel()
	ty := newTypes()
	s := newSLA(ty, slaOptions{now: newClock().Now, remindAfter: time.Hour})
	_, err := s.Decide(context.Background(), ty.Registry, saga.Snapshot[slaState]{Key: "k"}, true,
		projector.Event{Type: "ticket.opened", Payload: testevents.TicketClosed{}}, time.Now())
	if !errors.Is(err, projector.ErrInvalidPayload) {
		t.Fatalf("wrong payload type: %v", err)
	}
}

// A step's aggregate command (saga.Command) runs in the step's
// transaction through FetchForWriting: it sees the aggregate's current
// state (a ticket closed meanwhile is not closed again) and its events
// carry the timeout as causation and the instance's correlation id.
func TestSagaAggregateCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	type ticket struct{ Closed bool }
	repo, err := aggregate.New(e.store, aggregate.Config[ticket]{Name: "ticket", Folds: []aggregate.Fold[ticket]{
		aggregate.On(e.types.Closed, func(s *ticket, _ testevents.TicketClosed) { s.Closed = true }),
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := saga.New[slaState]("escalator", saga.Config{Now: clk.Now})
	must(saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, _ testevents.TicketOpened) error {
		in.After("escalate", time.Hour)
		return nil
	}))
	must(saga.OnTimeout(s, "escalate", func(_ context.Context, in *saga.Instance[slaState], _ saga.Timeout) error {
		saga.Command(in, repo, projector.Stream("ticket", in.Key()), func(_ context.Context, cur aggregate.Loaded[ticket]) ([]any, error) {
			if cur.State.Closed {
				return nil, nil
			}
			return []any{testevents.TicketClosed{Reason: "escalated"}}, nil
		})
		in.Complete()
		return nil
	}))
	p, err := s.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(e.ctx); err != nil {
			t.Error(err)
		}
	}()
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}})
	if err != nil {
		t.Fatal(err)
	}
	e.append(projector.Stream("ticket", "open"), testevents.TicketOpened{Title: "a"})
	e.append(projector.Stream("ticket", "closed"), testevents.TicketOpened{Title: "b"})
	e.append(projector.Stream("ticket", "closed"), testevents.TicketClosed{Reason: "by hand"})
	e.catchUp(d)
	clk.Advance(time.Hour)
	if n := e.fire(r); n != 2 {
		t.Fatalf("fired %d, want 2", n)
	}
	if got := e.events("ticket.closed"); got != 2 {
		t.Fatalf("%d ticket.closed events, want the manual one and one escalation", got)
	}
	in, err := saga.Show(e.ctx, e.store, "escalator", projector.SystemTenant, "open")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := e.store.ReadStream(e.ctx, projector.Stream("ticket", "open"), postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if len(evs) != 2 || last.Type != "ticket.closed" || last.Metadata.CausationID != in.Steps[1].CauseID ||
		last.Metadata.CorrelationID != in.CorrelationID || in.Status != saga.Completed {
		t.Fatalf("ticket stream %+v, instance %+v: want the escalation caused by the timeout step, correlated", evs, in)
	}
}

// A failing timeout step is rolled back alone: the other timeouts of its
// batch fire; it is retried after a backoff (not before), with its attempts
// and error recorded, and after TimeoutAttempts its instance is failed,
// visible to saga.List, and its other timeouts dropped.
func TestSagaTimeoutFailureRetriedThenFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := saga.New[slaState]("flaky", saga.Config{Now: clk.Now, TimeoutAttempts: 2})
	must(saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, o testevents.TicketOpened) error {
		in.State.Title = o.Title
		in.After("tick", time.Minute)
		in.After("later", time.Hour)
		return nil
	}))
	must(saga.OnTimeout(s, "tick", func(_ context.Context, in *saga.Instance[slaState], _ saga.Timeout) error {
		if in.State.Title == "bad" {
			return errors.New("boom")
		}
		in.State.Reminded++
		return nil
	}))
	must(saga.OnTimeout(s, "later", func(context.Context, *saga.Instance[slaState], saga.Timeout) error { return nil }))
	p, err := s.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(e.ctx); err != nil {
			t.Error(err)
		}
	}()
	r := e.runner(s)
	e.append(projector.Stream("ticket", "bad"), testevents.TicketOpened{Title: "bad"})
	e.append(projector.Stream("ticket", "good"), testevents.TicketOpened{Title: "good"})
	e.catchUp(d)

	clk.Advance(time.Minute)
	n, err := r.FireDue(e.ctx)
	if n != 1 || err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("first round: fired %d, error %v; want the good one fired and boom reported", n, err)
	}
	bad, err := saga.Show(e.ctx, e.store, "flaky", projector.SystemTenant, "bad")
	if err != nil {
		t.Fatal(err)
	}
	if bad.Version != 1 || len(bad.Timeouts) != 2 || bad.Timeouts[0].Attempts != 1 || !strings.Contains(bad.Timeouts[0].LastError, "boom") {
		t.Fatalf("after one failure: %+v", bad)
	}
	if n, err := r.FireDue(e.ctx); n != 0 || err != nil {
		t.Fatalf("retried before its backoff: fired %d, %v", n, err)
	}
	clk.Advance(time.Second)
	if _, err := r.FireDue(e.ctx); err == nil {
		t.Fatal("second attempt did not fail")
	}
	failed, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "flaky", Statuses: []saga.Status{saga.Failed}})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].Key != "bad" || !strings.Contains(failed[0].LastError, "boom") {
		t.Fatalf("failed instances: %+v", failed)
	}
	bad, err = saga.Show(e.ctx, e.store, "flaky", projector.SystemTenant, "bad")
	if err != nil {
		t.Fatal(err)
	}
	if len(bad.Timeouts) != 0 || bad.Version != 1 {
		t.Fatalf("a failed instance keeps %d timeouts, version %d", len(bad.Timeouts), bad.Version)
	}
	clk.Advance(2 * time.Hour)
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d; want only the good instance's later timeout", n)
	}
}

// NewRunner refuses a poll below a millisecond (a nanosecond made an idle
// runner spin through transactions: an API audit) or over an hour, and a
// batch size out of range, with ErrInvalidDefinition.
func TestRunnerConfigRanges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newSLA(e.types, slaOptions{now: newClock().Now, remindAfter: time.Hour})
	for _, cfg := range []saga.RunnerConfig{
		{Poll: time.Nanosecond}, {Poll: -time.Second}, {Poll: 2 * time.Hour}, {BatchSize: -1}, {BatchSize: 10_001},
	} {
		cfg.Store, cfg.Sagas = e.store, []saga.Definition{s}
		if _, err := saga.NewRunner(cfg); !errors.Is(err, saga.ErrInvalidDefinition) {
			t.Errorf("NewRunner(poll %v, batch %d): %v; want ErrInvalidDefinition", cfg.Poll, cfg.BatchSize, err)
		}
	}
	if _, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}, Poll: time.Millisecond}); err != nil {
		t.Fatalf("a 1ms poll: %v", err)
	}
}

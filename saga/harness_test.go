package saga_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	pgtest.Main(m)
}

// The test vocabulary: the helpdesk events of testevents plus what the
// "sla" saga reacts to and appends.
type (
	Assigned struct {
		Ticket string `json:"ticket"`
		Agent  string `json:"agent"`
	}
	Noted struct {
		Ticket string `json:"ticket"`
		N      int    `json:"n"`
	}
	Reminded struct {
		Ticket string `json:"ticket"`
	}
	Done struct {
		Ticket string `json:"ticket"`
	}
	// Undefined is never defined: appending it must fail.
	Undefined struct{}
)

type types struct {
	testevents.Types
	Assigned projector.EventType[Assigned]
	Noted    projector.EventType[Noted]
	Reminded projector.EventType[Reminded]
	Done     projector.EventType[Done]
}

func newTypes() types {
	t := types{Types: testevents.New()}
	t.Assigned = projector.MustDefine[Assigned](t.Registry, "agent.assigned")
	t.Noted = projector.MustDefine[Noted](t.Registry, "sla.noted")
	t.Reminded = projector.MustDefine[Reminded](t.Registry, "sla.reminded")
	t.Done = projector.MustDefine[Done](t.Registry, "sla.done")
	return t
}

// slaState is the test saga's state.
type slaState struct {
	Title    string `json:"title"`
	Comments int    `json:"comments"`
	Reminded int    `json:"reminded"`
	Agent    string `json:"agent,omitempty"`
}

// slaOptions tune the test saga.
type slaOptions struct {
	now         func() time.Time
	remindAfter time.Duration
	// enter, when set, is called as each step starts; the func it returns
	// as the step's handler returns.
	enter func(key string) func()
	// afterDecide, when set, is called after every handler decided (timeout
	// tells a timeout's handler from an event's): the crash tests kill their
	// process there, mid-transaction.
	afterDecide func(timeout bool)
	async       projection.AsyncConfig
}

// newSLA defines the test saga "sla", keyed by ticket id: opened starts it
// and schedules "remind"; each comment appends sla.noted; an assignment
// cancels the reminder; a close appends sla.done and completes it; the
// reminder appends sla.reminded unless the ticket has an agent.
func newSLA(ty types, o slaOptions) *saga.Saga[slaState] {
	s := saga.New[slaState]("sla", saga.Config{Now: o.now, Async: o.async})
	guard := func(key string, timeout ...bool) func() {
		exit := func() {}
		if o.enter != nil {
			exit = o.enter(key)
		}
		return func() {
			exit()
			if o.afterDecide != nil {
				o.afterDecide(len(timeout) > 0)
			}
		}
	}
	stream := func(in *saga.Instance[slaState]) projector.StreamRef {
		return projector.TenantStream(in.Tenant(), "sla", in.Key())
	}
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(ctx context.Context, in *saga.Instance[slaState], ev projector.Event, e testevents.TicketOpened) error {
		defer guard(in.Key())()
		in.State.Title = e.Title
		in.After("remind", o.remindAfter)
		return nil
	}))
	must(saga.On(s, ty.Commented, saga.ByStream, func(ctx context.Context, in *saga.Instance[slaState], ev projector.Event, e testevents.TicketCommented) error {
		defer guard(in.Key())()
		in.State.Comments++
		switch e.Body {
		case "bad-type":
			in.Append(stream(in), projector.AnyVersion, Undefined{})
		case "past":
			in.Schedule("remind", in.Now().Add(-time.Second))
		default:
			in.Append(stream(in), projector.AnyVersion, Noted{Ticket: in.Key(), N: in.State.Comments})
		}
		return nil
	}))
	must(saga.On(s, ty.Assigned, func(ev projector.Event, e Assigned) string { return e.Ticket },
		func(ctx context.Context, in *saga.Instance[slaState], ev projector.Event, e Assigned) error {
			defer guard(in.Key())()
			in.State.Agent = e.Agent
			in.Cancel("remind")
			return nil
		}))
	must(saga.On(s, ty.Closed, saga.ByStream, func(ctx context.Context, in *saga.Instance[slaState], ev projector.Event, e testevents.TicketClosed) error {
		defer guard(in.Key())()
		in.Append(stream(in), projector.AnyVersion, Done{Ticket: in.Key()})
		in.Complete()
		return nil
	}))
	must(saga.OnTimeout(s, "remind", func(ctx context.Context, in *saga.Instance[slaState], t saga.Timeout) error {
		defer guard(in.Key(), true)()
		if in.State.Agent == "" {
			in.State.Reminded++
			in.Append(stream(in), projector.AnyVersion, Reminded{Ticket: in.Key()})
		}
		return nil
	}))
	return s
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// clock is a test clock that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// env is one test's schema and store.
type env struct {
	t     testing.TB
	ctx   context.Context
	types types
	store *postgres.Store
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ty := newTypes()
	return &env{t: t, ctx: context.Background(), types: ty, store: pgtest.Store(t, ty.Registry)}
}

// append appends payloads to a ticket stream of the system tenant.
func (e *env) append(stream projector.StreamRef, payloads ...any) postgres.AppendResult {
	e.t.Helper()
	var res postgres.AppendResult
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = e.store.Append(e.ctx, tx, stream, projector.AnyVersion, payloads...)
		return err
	})
	if err != nil {
		e.t.Fatalf("append to %s: %v", stream, err)
	}
	return res
}

// dispatcher starts a dispatcher running s (and extra projections) and
// stops it when the test ends.
func (e *env) dispatcher(s saga.Definition, cfg projection.Config) *projection.Dispatcher {
	e.t.Helper()
	p, err := s.Projection(e.store)
	if err != nil {
		e.t.Fatal(err)
	}
	if cfg.Store == nil {
		cfg.Store = e.store
	}
	cfg.Projections = append(cfg.Projections, p)
	cfg.PollMax = 20 * time.Millisecond
	cfg.Recheck = 20 * time.Millisecond
	d, err := projection.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Errorf("stop dispatcher: %v", err)
		}
	})
	return d
}

func (e *env) catchUp(d *projection.Dispatcher) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) runner(sagas ...saga.Definition) *saga.Runner {
	e.t.Helper()
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: sagas, Poll: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) fire(r *saga.Runner) int {
	e.t.Helper()
	n, err := r.FireDue(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) events(typ string) int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM `+e.store.Table("projector_events")+` WHERE type = $1`, typ)
}

func (e *env) instances() int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM ` + e.store.Table("projector_saga_instances"))
}

func (e *env) pendingTimeouts() int {
	e.t.Helper()
	return e.count(`SELECT count(*) FROM ` + e.store.Table("projector_saga_timeouts"))
}

// waitFor polls cond until it holds or the deadline passes, backing off
// as pgtest.Eventually does.
func (e *env) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	pgtest.Eventually(e.t, timeout, what, cond)
}

// shardError returns the saga consumer's status and last error.
func (e *env) shardError() (projection.Status, string) {
	e.t.Helper()
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "sla", Instance: projection.SharedInstance})
	if errors.Is(err, projector.ErrNotFound) {
		return "", ""
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return st.Status, st.LastError
}

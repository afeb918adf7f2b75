package projection_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestDefinitionErrors(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	h := func(context.Context, pgx.Tx, projector.Event) error { return nil }
	cases := []struct {
		name  string
		build func() (projection.Projection, error)
	}{
		{"zero event type", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{})
			return p, projection.OnEvent(p, projector.EventType[testevents.TicketOpened]{}, h)
		}},
		{"handled twice", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{})
			_ = projection.OnEvent(p, types.Opened, h)
			return p, projection.OnEvent(p, types.Opened, h)
		}},
		{"batch and per-event", func() (projection.Projection, error) {
			p := projection.NewInline("p")
			_ = projection.OnEvent(p, types.Opened, h)
			return p, projection.OnBatch(p, func(context.Context, pgx.Tx, projection.Batch) error { return nil }, types.Closed)
		}},
		{"nil handler", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{})
			return p, projection.On[testevents.TicketOpened](p, types.Opened, nil)
		}},
		{"bad name", func() (projection.Projection, error) {
			p := projection.NewAsync("Bad Name!", projection.AsyncConfig{})
			return p, projection.OnEvent(p, types.Opened, h)
		}},
		{"bad batch size", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{BatchSize: -1})
			return p, projection.OnEvent(p, types.Opened, h)
		}},
		// Accepted until Start, where pgx could not encode it as an int4
		// (an API audit); the largest int4 is the partitioned fence's mark.
		{"version over an int4", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{Version: math.MaxInt32 + 1})
			return p, projection.OnEvent(p, types.Opened, h)
		}},
		{"version of the partitioned fence", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{Version: projection.PartitionedVersion})
			return p, projection.OnEvent(p, types.Opened, h)
		}},
		{"unknown start", func() (projection.Projection, error) {
			p := projection.NewAsync("p", projection.AsyncConfig{StartFrom: 99})
			return p, projection.OnEvent(p, types.Opened, h)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, regErr := tc.build()
			var valErr error
			switch p := p.(type) {
			case *projection.Async:
				valErr = p.Validate(types.Registry)
			case *projection.Inline:
				valErr = p.Validate(types.Registry)
			}
			if !errors.Is(valErr, projection.ErrInvalidDefinition) {
				t.Fatalf("validate: %v, want ErrInvalidDefinition (registration said %v)", valErr, regErr)
			}
		})
	}

	// A handler for a type the store's registry does not define fails the
	// dispatcher's construction, not the first event.
	e := newEnv(t)
	p := projection.NewAsync("p", projection.AsyncConfig{})
	type stranger struct{}
	strangers := projector.NewRegistry()
	must(projection.OnEvent(p, projector.MustDefine[stranger](strangers, "stranger.arrived"), h))
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}}); !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Fatalf("undefined type at start: %v", err)
	}
	q := counting(e.schema, e.types, "dup", projection.AsyncConfig{})
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{q, q}}); err == nil {
		t.Fatal("the same projection twice was accepted")
	}
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{q}, InstanceID: projection.SharedInstance}); !errors.Is(err, projection.ErrInvalidConfig) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("instance id %s: %v", projection.SharedInstance, err)
	}
}

// Start and Stop are idempotent; a stopped dispatcher leaves its shards
// unlocked for the next one, which resumes from the cursor.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(2, 1000, 20)
	p := counting(e.schema, e.types, "life", projection.AsyncConfig{BatchSize: 10})
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatalf("second start: %v", err)
	}
	eventually(t, time.Minute, "some progress", func() bool { return e.applied("life") > 0 })
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	select {
	case <-d.Stopped():
	default:
		t.Fatal("Stopped() not closed after Stop")
	}
	if err := d.Start(e.ctx); err == nil {
		t.Fatal("start after stop was accepted")
	}
	// The per-shard lock was released: a new dispatcher finishes the job.
	d2 := e.dispatcher(projection.Config{Projections: []*projection.Async{counting(e.schema, e.types, "life", projection.AsyncConfig{})}})
	if err := d2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("life", versions)

	var never *projection.Dispatcher
	never, _ = projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}})
	if err := never.Stop(ctx); err != nil {
		t.Fatalf("stop before start: %v", err)
	}
}

// Cancelling the context given to Start stops the dispatcher too.
func TestStartContextCancelStops(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{counting(e.schema, e.types, "c", projection.AsyncConfig{})}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-d.Stopped():
	case <-time.After(30 * time.Second):
		t.Fatal("dispatcher did not stop when its start context was cancelled")
	}
}

// FromNow skips what was committed before the consumer first registered;
// a random instance id's per-instance shard is removed at a graceful stop.
func TestStartFromNowAndPerInstanceCleanup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.appendMany(2, 300, 10)
	p := projection.NewAsync("fresh", projection.AsyncConfig{StartFrom: projection.FromNow, Delivery: projection.PerInstance})
	h := countingHandler(e.schema, "fresh")
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	later := appendWith(t, e.ctx, e.store, 1, 50, 3, "later")
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	// Events of transactions still running at registration are delivered,
	// so the start is the horizon, not the log head: some earlier events may
	// come too when something held the horizon. The later ones all must.
	got, _ := e.counts("fresh")
	for id, v := range later {
		if got[id] != v {
			t.Errorf("stream %s appended after the start: %d applied, want %d", id, got[id], v)
		}
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := projection.NewAdmin(e.store).List(e.ctx, "fresh"); len(st) != 0 {
		t.Fatalf("random instance's per-instance shard left behind: %+v", st)
	}
}

// A handler can append through the context it is given: the emitted event
// carries the handled event's correlation id and its id as causation, and
// commits with the cursor.
func TestHandlerEmitsWithCausation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := projection.NewAsync("emit", projection.AsyncConfig{})
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketOpened) error {
		_, err := projection.Emit(ctx, tx, projector.Stream("followup", ev.Stream.ID), projector.NoStream, testevents.TicketClosed{Reason: "auto"})
		return err
	}))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	if _, err := projection.Emit(e.ctx, nil, projector.Stream("x", "y"), projector.AnyVersion, testevents.TicketClosed{}); !errors.Is(err, projection.ErrNoDispatcher) {
		t.Fatalf("Emit outside a handler: %v", err)
	}
	opened := e.appendOne("t1", projector.NoStream, testevents.TicketOpened{Title: "x"})[0]
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := e.store.ReadStream(e.ctx, projector.Stream("followup", "t1"), postgresStreamAll)
	if err != nil || len(evs) != 1 {
		t.Fatalf("emitted events: %v %v", evs, err)
	}
	md := evs[0].Metadata
	if md.CausationID != opened.ID || md.CorrelationID != opened.Metadata.CorrelationID {
		t.Fatalf("emitted metadata %+v; want causation %s and correlation %s", md, opened.ID, opened.Metadata.CorrelationID)
	}
}

// Handlers get the dispatcher's transaction but cannot end it.
func TestHandlerCannotCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	p := projection.NewAsync("sneaky", projection.AsyncConfig{MaxAttempts: 1})
	must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		return tx.Commit(ctx)
	}))
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.appendOne("t", projector.NoStream, testevents.TicketOpened{Title: "x"})
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the shard to die on the refused commit", func() bool { return e.status(admin, "sneaky").Status == projection.StatusDead })
	if st := e.status(admin, "sneaky"); !strings.Contains(st.LastError, "owns this transaction") {
		t.Fatalf("last error %q", st.LastError)
	}
}

var postgresStreamAll = postgres.StreamQuery{}

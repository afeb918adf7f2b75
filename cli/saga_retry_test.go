package cli

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
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// sagaParkChildEnv makes this test binary the ops binary of an application
// with the "parking-sla" saga wired in.
const sagaParkChildEnv = "PROJECTOR_TEST_SAGA_RETRY_CLI"

func init() {
	asOpsBinary(sagaParkChildEnv, func(types testevents.Types, _, mode string) Wiring {
		return sagaWiring(func() saga.Definition { return parkingSaga(types, mode == "poison") })
	})
}

// parkingSaga is a ParkStream saga keyed by ticket that parks at the first
// failure: a comment "poison" fails when poison says so (the binary before
// the fix).
func parkingSaga(types testevents.Types, poison bool) *saga.Saga[[]string] {
	return poisonSaga(types, "parking-sla", projection.ParkStream, poison)
}

// poisonSaga is a saga keyed by ticket in the given error mode, failing at
// the first failure (MaxAttempts 1): it records each step in its state,
// and a comment "poison" fails when poison says so.
func poisonSaga(types testevents.Types, name string, mode projection.ErrorMode, poison bool) *saga.Saga[[]string] {
	s := saga.New[[]string](name, saga.Config{Async: projection.AsyncConfig{ErrorMode: mode, MaxAttempts: 1}})
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	must(saga.StartOn(s, types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[[]string], _ projector.Event, _ testevents.TicketOpened) error {
		in.State = append(in.State, "opened")
		return nil
	}))
	must(saga.On(s, types.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[[]string], _ projector.Event, c testevents.TicketCommented) error {
		if c.Body == "poison" && poison {
			return errors.New("cannot digest poison")
		}
		in.State = append(in.State, c.Body)
		return nil
	}))
	return s
}

// caughtUpDispatcher starts a dispatcher of projections on store, stopped
// when the test ends, and waits until it has caught up.
func caughtUpDispatcher(t *testing.T, store *postgres.Store, projections ...*projection.Async) *projection.Dispatcher {
	t.Helper()
	d, err := projection.New(projection.Config{Store: store, Projections: projections, PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

// `saga retry` end to end, as the application's ops binary: a parked instance is
// retried through its park (--here: fails while the poison fails, exit 1,
// then applies the sequence; again is refused, exit 3); a failed instance
// is reactivated once (again: exit 3); usage errors exit 2.
func TestSagaRetryCommand(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &dlEnv{t: t, ctx: context.Background(), store: store, url: pgtest.URL(t), app: sagaParkChildEnv, mode: "poison"}
	for _, id := range []string{"k", "f"} {
		err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream,
				testevents.TicketOpened{Title: id}, testevents.TicketCommented{Body: "poison"}, testevents.TicketCommented{Body: "later"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := parkingSaga(types, true)
	p, err := s.Projection(store)
	if err != nil {
		t.Fatal(err)
	}
	caughtUpDispatcher(t, store, p)
	// f is made failed as a timeout that kept failing would leave it.
	if _, err := saga.Show(e.ctx, store, "parking-sla", projector.SystemTenant, "f"); err != nil {
		t.Fatal(err)
	}
	id, err := saga.InstancePark(e.ctx, store, "parking-sla", projector.SystemTenant, "f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := projection.DiscardPark(e.ctx, store, id, "test"); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE ` + store.Table("projector_saga_instances") + ` SET status = 'failed', last_error = 'timeout kept failing' WHERE key = 'f'`)

	if out, stderr, code := e.cli("saga", "list", "parking-sla", "--status", "parked"); code != ExitOK || !strings.Contains(out, "k") || strings.Contains(out, "failed") {
		t.Fatalf("saga list --status parked: exit %d: %s %s", code, out, stderr)
	}
	if out, stderr, code := e.cli("parked", "list"); code != ExitOK || !strings.Contains(out, "saga instance k (tenant") {
		t.Fatalf("parked list: exit %d: %s %s", code, out, stderr)
	}
	kid, err := saga.InstancePark(e.ctx, store, "parking-sla", projector.SystemTenant, "k")
	if err != nil {
		t.Fatal(err)
	}
	if out, stderr, code := e.cli("parked", "show", fmt.Sprint(kid)); code != ExitOK || !strings.Contains(out, "saga instance k (tenant") ||
		!strings.Contains(out, "sequence:   2 events") || !strings.Contains(out, "__system__/ticket/k v2 ticket.commented") {
		t.Fatalf("parked show: exit %d:\n%s%s", code, out, stderr)
	}
	if _, stderr, code := e.cli("saga", "retry", "parking-sla", "k", "--here"); code != ExitError || !strings.Contains(stderr, "still parked") {
		t.Fatalf("failing retry: exit %d: %s", code, stderr)
	}
	e.mode = "fixed"
	if out, stderr, code := e.cli("saga", "retry", "parking-sla", "k", "--here"); code != ExitOK || !strings.Contains(out, "applied its 2 events") {
		t.Fatalf("retry: exit %d: %s %s", code, out, stderr)
	}
	in, err := saga.Show(e.ctx, store, "parking-sla", projector.SystemTenant, "k")
	if err != nil || in.Status != saga.Active || string(in.State) != `["opened", "poison", "later"]` {
		t.Fatalf("k after retry: %s %s, %v; want active with the sequence applied once", in.Status, in.State, err)
	}
	if _, stderr, code := e.cli("saga", "retry", "parking-sla", "k", "--here"); code != ExitRefused {
		t.Fatalf("retry of an active instance: exit %d: %s", code, stderr)
	}
	if out, stderr, code := e.cli("saga", "retry", "parking-sla", "f"); code != ExitOK || !strings.Contains(out, "active again") {
		t.Fatalf("reactivate: exit %d: %s %s", code, out, stderr)
	}
	if _, stderr, code := e.cli("saga", "retry", "parking-sla", "f"); code != ExitRefused {
		t.Fatalf("second reactivate: exit %d: %s", code, stderr)
	}
	for _, args := range [][]string{
		{"saga", "retry", "parking-sla"}, {"saga", "retry", "parking-sla", "k", "--tenant", "a\xffb"}, {"saga", "retry", "parking-sla", "k", "--by", "\x1b[2J"},
	} {
		if _, stderr, code := e.cli(args...); code != ExitUsage {
			t.Fatalf("%q: exit %d (%s), want %d", args, code, stderr, ExitUsage)
		}
	}
}

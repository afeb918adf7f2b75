package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// sagaDLChildEnv makes this test binary the ops binary of an application
// with the continuous-mode "dl-sla" saga wired in (and no async
// projection): "poison" is the binary before the fix, "fixed" after.
const sagaDLChildEnv = "PROJECTOR_TEST_SAGA_DL_CLI"

func init() {
	asOpsBinary(sagaDLChildEnv, func(types testevents.Types, _, mode string) Wiring {
		return sagaWiring(func() saga.Definition { return continuousSaga(types, mode == "poison") })
	})
}

// continuousSaga is a saga in continuous mode (SkipApplyErrors) keyed by
// ticket: a comment "poison" fails when poison says so, which dead-letters
// the event under the saga's consumer and fails the instance.
func continuousSaga(types testevents.Types, poison bool) *saga.Saga[[]string] {
	return poisonSaga(types, "dl-sla", projection.SkipApplyErrors, poison)
}

// `dead-letters retry --here` finds a saga's consumer as `parked retry
// --here` does (cli.Config.Wire's Sagas, not only its async projections):
// the dead letter of a continuous-mode saga's failed step is retried in
// the application's binary, after `saga retry` reactivated the instance,
// and the step is taken once.
func TestDeadLettersRetryHereFindsSagas(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &dlEnv{t: t, ctx: context.Background(), store: store, url: pgtest.URL(t), app: sagaDLChildEnv, mode: "fixed"}
	err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(e.ctx, tx, projector.Stream("ticket", "d"), projector.NoStream,
			testevents.TicketOpened{Title: "d"}, testevents.TicketCommented{Body: "poison"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := continuousSaga(types, true).Projection(store)
	if err != nil {
		t.Fatal(err)
	}
	caughtUpDispatcher(t, store, p)
	dls, err := projection.ListDeadLetters(e.ctx, store, projection.DeadLetterFilter{Consumer: p.Name(), Status: projection.DeadLetterOpen})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters of %s: %+v, %v; want the poison's", p.Name(), dls, err)
	}
	if out, stderr, code := e.cli("saga", "retry", "dl-sla", "d"); code != ExitOK || !strings.Contains(out, "active again") {
		t.Fatalf("reactivate: exit %d: %s %s", code, out, stderr)
	}
	out, stderr, code := e.cli("dead-letters", "retry", fmt.Sprint(dls[0].ID), "--here")
	if code != ExitOK || !strings.Contains(out, "applied and resolved") {
		t.Fatalf("dead-letters retry --here of a saga's dead letter: exit %d: %s %s", code, out, stderr)
	}
	in, err := saga.Show(e.ctx, store, "dl-sla", projector.SystemTenant, "d")
	if err != nil || in.Status != saga.Active || string(in.State) != `["opened", "poison"]` {
		t.Fatalf("d after the retry: %s %s, %v; want active with the step taken once", in.Status, in.State, err)
	}
}

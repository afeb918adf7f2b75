package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// dlBulkChildEnv names the ops binary of an application with the "hooked"
// projection wired in, and nothing else: a dead letter of another consumer
// ("stranger") has no handlers in it.
const dlBulkChildEnv = "PROJECTOR_TEST_DEADLETTER_BULK_CLI"

func init() {
	asOpsBinary(dlBulkChildEnv, func(types testevents.Types, schema, _ string) Wiring {
		return Wiring{Async: []*projection.Async{hooked(schema, types)}}
	})
}

// bulkHooks holds, by schema, what the "hooked" projection calls after
// applying an event: a test's way to act as another operator at an exact
// point of a bulk retry (between the retries of two dead letters), with no
// sleep.
var bulkHooks sync.Map // schema → func(projector.Event)

// hooked is poisonable's "poison" projection in continuous mode, calling
// the schema's bulk hook (if any) once it has applied an event.
func hooked(schema string, types testevents.Types) *projection.Async {
	p := projection.NewAsync("hooked", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1})
	trace, sw := pgx.Identifier{schema, "trace"}.Sanitize(), pgx.Identifier{schema, "poison_switch"}.Sanitize()
	if err := projection.On(p, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+trace+` (event_id) VALUES ($1)`, ev.ID); err != nil {
			return err
		}
		var fail bool
		if err := tx.QueryRow(ctx, `SELECT fail FROM `+sw).Scan(&fail); err != nil {
			return err
		}
		if o.Title == "poison" && fail {
			return errors.New("cannot digest poison")
		}
		if h, ok := bulkHooks.Load(schema); ok {
			h.(func(projector.Event))(ev)
		}
		return nil
	}); err != nil {
		panic(err)
	}
	return p
}

// poisons appends n streams, each opened with a poison event, and returns
// the poison events in order.
func (e *dlEnv) poisons(n int, prefix string) []projector.Event {
	e.t.Helper()
	var out []projector.Event
	for i := range n {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("%s%d", prefix, i)), projector.NoStream,
				testevents.TicketOpened{Title: "poison"})
			if err == nil {
				out = append(out, res.Events[0])
			}
			return err
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	return out
}

// deadLetterOf returns the open dead letter of consumer for ev.
func (e *dlEnv) deadLetterOf(consumer string, ev projector.Event) int64 {
	e.t.Helper()
	var id int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT id FROM `+e.store.Table("projector_dead_letters")+` WHERE consumer = $1 AND event_id = $2`,
		consumer, ev.ID).Scan(&id); err != nil {
		e.t.Fatalf("dead letter of %s for %s: %v", consumer, ev.ID, err)
	}
	return id
}

// wantDeadLetter fails the test unless dead letter id has status and
// attempts.
func (e *dlEnv) wantDeadLetter(id int64, status string, attempts int) {
	e.t.Helper()
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, id)
	if err != nil || dl.Status != status || dl.Attempts != attempts {
		e.t.Errorf("dead letter %d: %s, %d attempts (%v); want %s, %d", id, dl.Status, dl.Attempts, err, status, attempts)
	}
}

// A bulk `dead-letters retry --here` goes on past a dead letter it cannot
// retry: one of another consumer this binary does not wire (named among
// several ids), and one another operator discards between the listing of
// --all and its retry. Each is named on a line of its own, the others are
// retried and resolved, and the error sums it up with a non-zero exit.
// Before, the first such dead letter ended the command and the ones after
// it were never tried.
func TestDeadLettersRetryGoesOnPastOne(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	e.app, e.mode = dlBulkChildEnv, "1"
	evs := e.poisons(5, "b")
	caughtUpDispatcher(t, store, hooked(store.Schema(), types), poisonable("stranger", store.Schema(), types,
		projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1}))
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i] = e.deadLetterOf("hooked", ev)
	}
	stranger := e.deadLetterOf("stranger", evs[0])
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)

	// Several ids, the middle one of a consumer this binary lacks.
	out, stderr, code := e.cli("dead-letters", "retry", "--here", fmt.Sprint(ids[0]), fmt.Sprint(stranger), fmt.Sprint(ids[1]))
	if code != ExitUsage {
		t.Errorf("ids with an unwired consumer's: exit %d, want %d (the unwired one's)", code, ExitUsage)
	}
	for _, want := range []string{
		fmt.Sprintf("dead letter %d: applied and resolved", ids[0]),
		fmt.Sprintf("dead letter %d: not retried: dead letter %d belongs to stranger, and this binary has no async projection or saga of that name", stranger, stranger),
		fmt.Sprintf("dead letter %d: applied and resolved", ids[1]),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ids with an unwired consumer's: output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, "2 of 3 dead letters resolved; 1 could not be retried: dead letter") {
		t.Errorf("ids with an unwired consumer's: error %q, want the counts", stderr)
	}
	e.wantDeadLetter(ids[0], projection.DeadLetterResolved, 2)
	e.wantDeadLetter(stranger, projection.DeadLetterOpen, 1)
	e.wantDeadLetter(ids[1], projection.DeadLetterResolved, 2)

	// --all, and another operator discards the second of the three open
	// ones while the first is being retried (the hook runs in its handler).
	var once sync.Once
	bulkHooks.Store(store.Schema(), func(ev projector.Event) {
		if ev.ID == evs[2].ID {
			once.Do(func() {
				if err := projection.DiscardDeadLetters(e.ctx, store, []int64{ids[3]}); err != nil {
					t.Errorf("discard meanwhile: %v", err)
				}
			})
		}
	})
	t.Cleanup(func() { bulkHooks.Delete(store.Schema()) })
	out, stderr, code = e.cli("dead-letters", "retry", "--here", "--all", "--consumer", "hooked")
	if code != ExitRefused {
		t.Errorf("--all with one discarded meanwhile: exit %d, want %d (the refusal's)", code, ExitRefused)
	}
	for _, want := range []string{
		fmt.Sprintf("dead letter %d: applied and resolved", ids[2]),
		fmt.Sprintf("dead letter %d: not retried: retry dead letter %d: it is discarded already", ids[3], ids[3]),
		fmt.Sprintf("dead letter %d: applied and resolved", ids[4]),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--all with one discarded meanwhile: output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr, "2 of 3 dead letters resolved; 1 could not be retried: retry dead letter") {
		t.Errorf("--all with one discarded meanwhile: error %q, want the counts", stderr)
	}
	e.wantDeadLetter(ids[2], projection.DeadLetterResolved, 2)
	e.wantDeadLetter(ids[3], projection.DeadLetterDiscarded, 1)
	e.wantDeadLetter(ids[4], projection.DeadLetterResolved, 2)
	for i, ev := range evs {
		if want := map[bool]int{true: 0, false: 1}[i == 3]; e.traced(ev.ID) != want {
			t.Errorf("event %d applied %d times, want %d", i, e.traced(ev.ID), want)
		}
	}
}

// Ctrl-C during a bulk `dead-letters retry --here` stops it at once (the
// dead letter being retried is not, nothing recorded), and it says how
// many it tried and how many it left untried, exit 1. Before, the error
// of the interrupted one was all it said.
func TestDeadLettersRetryInterrupted(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	e.app, e.mode = dlBulkChildEnv, "1"
	evs := e.poisons(3, "i")
	caughtUpDispatcher(t, store, hooked(store.Schema(), types))
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = fmt.Sprint(e.deadLetterOf("hooked", ev))
	}
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	ctx, interrupt := context.WithCancel(e.ctx)
	defer interrupt()
	bulkHooks.Store(store.Schema(), func(projector.Event) { interrupt() })
	t.Cleanup(func() { bulkHooks.Delete(store.Schema()) })
	out, stderr, code := runOps(ctx, dlBulkChildEnv, "1", append([]string{"--database-url", e.url, "--schema", store.Schema(),
		"dead-letters", "retry", "--here"}, ids...)...)
	if code != ExitError {
		t.Errorf("interrupted: exit %d, want %d", code, ExitError)
	}
	if want := "interrupted: 1 of 3 dead letters tried (0 resolved), 2 left untried"; !strings.Contains(out, want) {
		t.Errorf("interrupted: output lacks %q:\n%s", want, out)
	}
	if want := "0 of 3 dead letters resolved; 2 left untried (interrupted); 1 could not be retried: "; !strings.Contains(stderr, want) {
		t.Errorf("interrupted: error %q, want %q", stderr, want)
	}
	for i, ev := range evs {
		e.wantDeadLetter(e.deadLetterOf("hooked", ev), projection.DeadLetterOpen, 1)
		if n := e.traced(ev.ID); n != 0 {
			t.Errorf("event %d applied %d times after the interrupt, want 0", i, n)
		}
	}
}

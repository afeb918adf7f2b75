package cli

import (
	"context"
	"encoding/json"
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
	"github.com/projectorhq/projector/stores/postgres"
)

// dlChildEnv names the ops binary of an application with the "tolerant"
// projection wired in (cli.Config.Wire): the tests below run its commands
// as an operator runs the real one (see asOpsBinary).
const dlChildEnv = "PROJECTOR_TEST_DEADLETTER_CLI"

func init() {
	asOpsBinary(dlChildEnv, func(types testevents.Types, schema, _ string) Wiring {
		return Wiring{Async: []*projection.Async{tolerant(schema, types)}}
	})
}

// tolerant is poisonable in continuous mode: it dead-letters poison.
func tolerant(schema string, types testevents.Types) *projection.Async {
	return poisonable("tolerant", schema, types, projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1})
}

// poisonable is a projection, in the error mode cfg says, that fails on
// opened events titled "poison" while the switch table says so, after
// writing a trace row (which the failure rolls back).
func poisonable(name, schema string, types testevents.Types, cfg projection.AsyncConfig) *projection.Async {
	p := projection.NewAsync(name, cfg)
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
		return nil
	}); err != nil {
		panic(err)
	}
	if err := projection.OnEvent(p, types.Commented, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		panic(err)
	}
	return p
}

type dlEnv struct {
	t     *testing.T
	ctx   context.Context
	store *postgres.Store
	url   string
	// app and mode say which application the ops commands are of (the
	// variable asOpsBinary declared it under, and its value): the
	// dead-letter tests' when app is empty.
	app, mode string
}

// newPoisonEnv makes a store of the test event types (returned too) with the tables the
// poisoned consumers of these tests use: trace (the events applied) and
// poison_switch (whether the poison still fails: true at first).
func newPoisonEnv(t *testing.T) (*dlEnv, *postgres.Store, testevents.Types) {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &dlEnv{t: t, ctx: context.Background(), store: store, url: pgtest.URL(t)}
	e.exec(`CREATE TABLE ` + store.Table("trace") + ` (event_id uuid NOT NULL)`)
	e.exec(`CREATE TABLE ` + store.Table("poison_switch") + ` (fail bool NOT NULL)`)
	e.exec(`INSERT INTO ` + store.Table("poison_switch") + ` VALUES (true)`)
	return e, store, types
}

// cli runs the ops commands and returns standard output, standard error
// and exit code.
func (e *dlEnv) cli(args ...string) (string, string, int) {
	e.t.Helper()
	return e.cliSchema(e.store.Schema(), args...)
}

// cliSchema runs the ops commands on schema in this process (runOps).
func (e *dlEnv) cliSchema(schema string, args ...string) (string, string, int) {
	e.t.Helper()
	app, mode := e.app, e.mode
	if app == "" {
		app, mode = dlChildEnv, "1"
	}
	return runOps(e.ctx, app, mode, append([]string{"--database-url", e.url, "--schema", schema}, args...)...)
}

func (e *dlEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *dlEnv) traced(id fmt.Stringer) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("trace")+` WHERE event_id = $1`, id.String()).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// The dead-letter commands end to end, as the application's ops binary: list and show
// (with the payload, and "event pruned" for a pruned one), retry --here that
// applies once and is refused the second time, a failing retry that keeps
// the dead letter with the new error, discard, --all, a retry request a
// running dispatcher carries out, and the exit code of every refusal.
func TestDeadLettersCommand(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	var poisons []projector.Event
	for i := range 4 {
		err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			res, err := store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("p%d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
			poisons = append(poisons, res.Events[0])
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	d := caughtUpDispatcher(t, store, tolerant(store.Schema(), types))

	out, stderr, code := e.cli("dead-letters", "list", "-o", "json")
	var listed []projection.DeadLetter
	if code != ExitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 4 {
		t.Fatalf("list -o json: exit %d, %q, %s", code, out, stderr)
	}
	ids := make([]string, 4)
	for i, dl := range listed {
		ids[i] = fmt.Sprint(dl.ID)
		if dl.EventID != poisons[i].ID || dl.Status != "open" {
			t.Fatalf("listed %d: %+v, want the poison %s, open", i, dl, poisons[i].ID)
		}
	}
	if out, _, code := e.cli("dead-letters", "list", "--consumer", "tolerant", "--type", "ticket.opened", "--since", "1h", "--limit", "2", "--after", ids[0]); code != ExitOK ||
		!strings.Contains(out, "cannot digest poison") || strings.Count(out, "\n") != 3 || !strings.Contains(out, "\n"+ids[1]+" ") || !strings.Contains(out, "\n"+ids[2]+" ") {
		t.Fatalf("list, a page of two after the first:\n%s", out)
	}
	if out, _, code := e.cli("dead-letters", "show", ids[0]); code != ExitOK || !strings.Contains(out, `"poison"`) || !strings.Contains(out, poisons[0].ID.String()) {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}

	// A retry that succeeds is applied once, out of order, and says so.
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, stderr, code := e.cli("dead-letters", "retry", "--here", ids[0]); code != ExitOK || !strings.Contains(out, "applied and resolved") || !strings.Contains(out, "out of order") {
		t.Fatalf("retry: exit %d: %s %s", code, out, stderr)
	}
	if n := e.traced(poisons[0].ID); n != 1 {
		t.Fatalf("retried event applied %d times", n)
	}
	if _, stderr, code := e.cli("dead-letters", "retry", "--here", ids[0]); code != ExitRefused || !strings.Contains(stderr, "resolved already") {
		t.Fatalf("second retry: exit %d: %s", code, stderr)
	}
	if n := e.traced(poisons[0].ID); n != 1 {
		t.Fatalf("after a second retry the event is applied %d times", n)
	}

	// A retry that fails keeps it, with the new error and attempt count.
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = true`)
	if out, _, code := e.cli("dead-letters", "retry", "--here", ids[1]); code != ExitError || !strings.Contains(out, "failed again (attempt 2)") {
		t.Fatalf("failing retry: exit %d: %s", code, out)
	}
	out, _, _ = e.cli("dead-letters", "show", "-o", "json", ids[1])
	var shown struct {
		projection.DeadLetter
		EventPruned bool `json:"event_pruned"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil || shown.Attempts != 2 || shown.Status != "open" || !strings.HasPrefix(shown.Error, "retry: ") || shown.EventPruned {
		t.Fatalf("after a failing retry: %+v, %v", shown, err)
	}

	// A pruned event: said by show, refused by retry, discard closes it.
	e.exec(`DELETE FROM `+store.Table("projector_events")+` WHERE id = $1`, poisons[2].ID)
	if out, _, code := e.cli("dead-letters", "show", ids[2]); code != ExitOK || !strings.Contains(out, "event pruned") {
		t.Fatalf("show pruned: exit %d: %s", code, out)
	}
	if _, stderr, code := e.cli("dead-letters", "retry", "--here", ids[2]); code != ExitRefused || !strings.Contains(stderr, "pruned") {
		t.Fatalf("retry pruned: exit %d: %s", code, stderr)
	}
	if out, _, code := e.cli("dead-letters", "discard", ids[2]); code != ExitOK || !strings.Contains(out, "discarded 1") {
		t.Fatalf("discard: exit %d: %s", code, out)
	}
	if _, _, code := e.cli("dead-letters", "discard", ids[2]); code != ExitRefused {
		t.Fatalf("discard twice: exit %d", code)
	}

	// --all retries every open one of the consumer: ids[1] and ids[3].
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, stderr, code := e.cli("dead-letters", "retry", "--here", "--all", "--consumer", "tolerant"); code != ExitOK || strings.Count(out, "applied and resolved") != 2 {
		t.Fatalf("retry --all: exit %d: %s %s", code, out, stderr)
	}
	for _, ev := range []projector.Event{poisons[1], poisons[3]} {
		if n := e.traced(ev.ID); n != 1 {
			t.Fatalf("--all applied %s %d times", ev.ID, n)
		}
	}
	out, _, _ = e.cli("dead-letters", "list", "--status", "all", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 4 {
		t.Fatalf("list --status all: %v %s", err, out)
	}
	for i, want := range []string{"resolved", "resolved", "discarded", "resolved"} {
		if listed[i].Status != want {
			t.Fatalf("dead letter %d: %s, want %s", listed[i].ID, listed[i].Status, want)
		}
	}

	// Without --here the request is recorded and the running dispatcher,
	// which has the projection, carries it out.
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = true`)
	var late projector.Event
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		res, err := store.Append(e.ctx, tx, projector.Stream("ticket", "late"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		late = res.Events[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, stderr, code := e.cli("dead-letters", "retry", "--all", "--consumer", "tolerant"); code != ExitOK || !strings.Contains(out, "retry requested for 1") {
		t.Fatalf("retry request: exit %d: %s %s", code, out, stderr)
	}
	pgtest.Eventually(t, 30*time.Second, "the dispatcher to carry out the retry request", func() bool { return e.traced(late.ID) == 1 })
	out, _, _ = e.cli("dead-letters", "list", "--status", "open", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 0 {
		t.Fatalf("open after the dispatcher's retry: %v %s", err, out)
	}

	// A dead letter of a model a rebuild replaced: refused, as a request
	// and --here, saying why; discard closes it. (The rebuild row stands
	// for an in-place rebuild that replayed the event.)
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = true`)
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(e.ctx, tx, projector.Stream("ticket", "replaced"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	out, _, _ = e.cli("dead-letters", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 1 || listed[0].ModelRebuildID != 0 {
		t.Fatalf("open before the rebuild: %v %s", err, out)
	}
	replaced := fmt.Sprint(listed[0].ID)
	e.exec(`INSERT INTO ` + store.Table("projector_rebuilds") + ` (name, version, mode, status, tables) VALUES ('tolerant', 1, 'in-place', 'done', '{}')`)
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	for _, args := range [][]string{{"dead-letters", "retry", replaced}, {"dead-letters", "retry", "--here", replaced}} {
		if _, stderr, code := e.cli(args...); code != ExitRefused || !strings.Contains(stderr, "replaced") || !strings.Contains(stderr, "discard it") {
			t.Fatalf("%v of a replaced model's dead letter: exit %d: %s", args, code, stderr)
		}
	}
	out, _, _ = e.cli("dead-letters", "list", "--model", "superseded", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 1 || fmt.Sprint(listed[0].ID) != replaced {
		t.Fatalf("list --model superseded: %v %s", err, out)
	}
	out, _, _ = e.cli("dead-letters", "list", "--model", "live", "-o", "json")
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 0 {
		t.Fatalf("list --model live: %v %s", err, out)
	}
	if out, stderr, code := e.cli("dead-letters", "retry", "--here", "--all", "--consumer", "tolerant"); code != ExitOK ||
		!strings.Contains(out, "left 1 open dead letters of tolerant recorded against a model a rebuild replaced") || !strings.Contains(out, "no open dead letters of tolerant to retry") {
		t.Fatalf("retry --all with only a replaced model's dead letter: exit %d: %s %s", code, out, stderr)
	}
	if out, _, code := e.cli("dead-letters", "discard", replaced); code != ExitOK || !strings.Contains(out, "discarded 1") {
		t.Fatalf("discard a replaced model's dead letter: exit %d: %s", code, out)
	}

	// Refusals and bad command lines.
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"dead-letters", "retry"}, ExitUsage},
		{[]string{"dead-letters", "retry", "--all"}, ExitUsage},
		{[]string{"dead-letters", "retry", "--all", "--consumer", "tolerant", "5"}, ExitUsage},
		{[]string{"dead-letters", "retry", "--consumer", "tolerant", "5"}, ExitUsage},
		{[]string{"dead-letters", "retry", "x1"}, ExitUsage},
		{[]string{"dead-letters", "retry", "0"}, ExitUsage},
		{[]string{"dead-letters", "show"}, ExitUsage},
		{[]string{"dead-letters", "show", "1", "2"}, ExitUsage},
		{[]string{"dead-letters", "discard"}, ExitUsage},
		{[]string{"dead-letters", "list", "--limit", "0"}, ExitUsage},
		{[]string{"dead-letters", "list", "--limit", "10001"}, ExitUsage},
		{[]string{"dead-letters", "list", "--status", "gone"}, ExitUsage},
		{[]string{"dead-letters", "list", "--reason", "x"}, ExitUsage},
		{[]string{"dead-letters", "list", "--model", "old"}, ExitUsage},
		{[]string{"dead-letters", "list", "--since", "yesterday"}, ExitUsage},
		{[]string{"dead-letters", "list", "-o", "yaml"}, ExitUsage},
		{[]string{"dead-letters", "nope"}, ExitUsage},
		{[]string{"dead-letters", "show", "999999"}, ExitError},
		{[]string{"dead-letters", "retry", ids[0]}, ExitRefused},
		{[]string{"dead-letters", "discard", ids[0]}, ExitRefused},
	} {
		if _, stderr, code := e.cli(c.args...); code != c.code {
			t.Errorf("%v: exit %d, want %d (%s)", c.args, code, c.code, stderr)
		}
	}
}

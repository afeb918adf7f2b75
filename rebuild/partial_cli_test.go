package rebuild_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// `rebuild NAME --here --tenant X` and `--here --stream-type T --stream-id ID` through the
// command tree of a binary that wires the projection: the scope is rebuilt
// here, and every bad command line (exit 2: --here missing, a half-named
// stream, a flag of whole rebuilds), binary without the projection
// (exit 2, saying which binary to use) and refusal (exit 3) changes nothing.
func TestPartialRebuildCLI(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	for _, s := range []projector.StreamRef{projector.TenantStream("a", "ticket", "1"), projector.TenantStream("a", "ticket", "2"), projector.TenantStream("b", "ticket", "1")} {
		if err := e.ticket(s); err != nil {
			t.Fatal(err)
		}
	}
	tickets := e.tickets("tickets", "tickets", 1)
	bare := projection.NewAsync("bare", projection.AsyncConfig{Tables: []string{e.schema + ".totals"}})
	must(projection.OnEvent(bare, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	d := e.dispatcher(tickets, bare)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET title = 'corrupt'`)

	wired := cli.Config{Registry: e.types.Registry, Wire: func(string) (cli.Wiring, error) {
		return cli.Wiring{Async: []*projection.Async{e.tickets("tickets", "tickets", 1), bare}}, nil
	}}
	run := func(cfg cli.Config, args ...string) (int, string) {
		t.Helper()
		root := cli.New(cfg)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--database-url", pgtest.URL(t), "--schema", e.schema}, args...))
		err := root.ExecuteContext(ctx)
		if err != nil {
			out.WriteString(err.Error())
		}
		return cli.ExitCode(err), out.String()
	}
	for _, c := range []struct {
		cfg  cli.Config
		args []string
		code int
		says string
	}{
		{wired, []string{"rebuild", "tickets", "--tenant", "a"}, cli.ExitUsage, "add --here"},
		{wired, []string{"rebuild", "tickets", "--here", "--stream-type", "ticket"}, cli.ExitUsage, "go together"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "a", "--in-place"}, cli.ExitUsage, "--in-place does not apply"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "a", "--partial-batch", "-1"}, cli.ExitUsage, "--partial-batch"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "a", "--partial-batch", "100001"}, cli.ExitUsage, "--partial-batch"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "a", "--partial-batch", "99999999999999999999"}, cli.ExitUsage, "partial-batch"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "bad\xff"}, cli.ExitUsage, "tenant"},
		{wired, []string{"rebuild", "tickets", "--here", "--tenant", "a\x00"}, cli.ExitUsage, "tenant"},
		{wired, []string{"rebuild", "missing", "--here", "--tenant", "a"}, cli.ExitUsage, "no async projection missing (it has: tickets, bare)"},
		{cli.Config{Registry: e.types.Registry}, []string{"rebuild", "tickets", "--here", "--tenant", "a"}, cli.ExitUsage, "your application's binary"},
		{wired, []string{"rebuild", "bare", "--here", "--tenant", "a"}, cli.ExitRefused, "cannot clear tenant a"},
	} {
		code, out := run(c.cfg, c.args...)
		if code != c.code || !strings.Contains(out, c.says) {
			t.Errorf("%v: exit %d, %q; want exit %d saying %q", c.args, code, out, c.code, c.says)
		}
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE title = 'corrupt'`); n != 3 {
		t.Fatalf("%d corrupt rows after commands that should have changed nothing, want 3", n)
	}

	code, out := run(wired, "rebuild", "tickets", "--here", "--tenant", "a")
	if code != cli.ExitOK || !strings.Contains(out, "partial rebuild of tickets, tenant a: 8 events replayed") {
		t.Fatalf("exit %d: %s", code, out)
	}
	code, out = run(wired, "rebuild", "tickets", "--here", "--tenant", "b", "--stream-type", "ticket", "--stream-id", "1", "--partial-batch", "1")
	if code != cli.ExitOK || !strings.Contains(out, "b/ticket/1: 4 events replayed") {
		t.Fatalf("exit %d: %s", code, out)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE title = 'corrupt'`); n != 0 {
		t.Fatalf("%d corrupt rows left", n)
	}
}

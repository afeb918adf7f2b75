package main_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// restoredSchema returns a schema that looks like a pg_dump restored into a
// younger cluster: three events from two transactions and a consumer past
// the first, with every stored transaction id far ahead of the server's.
func restoredSchema(t *testing.T) (schema string) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema = pgtest.Schema(t)
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: testevents.New().Registry})
	if err != nil {
		t.Fatal(err)
	}
	var first projector.Position
	for i, payloads := range [][]any{
		{testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"}},
		{testevents.TicketClosed{}},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			res, err := store.Append(ctx, tx, projector.Stream("ticket", "t1"), projector.ExactVersion(int64(2*i)), payloads...)
			if i == 0 && err == nil {
				first = res.Events[0].Position
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	const shift = ` = (%s::text::bigint + 2000000000)::text::xid8`
	add := func(col string) string { return col + strings.ReplaceAll(shift, "%s", col) }
	for _, sql := range []string{
		`INSERT INTO ` + store.Table("projector_consumers") + ` (name, instance_id, cursor_tx_id, cursor_seq) VALUES ('tickets', '__shared__', $1, $2)`,
		`UPDATE ` + store.Table("projector_events") + ` SET ` + add("tx_id"),
		`UPDATE ` + store.Table("projector_streams") + ` SET ` + add("last_tx_id"),
		`UPDATE ` + store.Table("projector_consumers") + ` SET ` + add("cursor_tx_id"),
	} {
		args := []any{}
		if strings.Contains(sql, "$1") {
			args = []any{first.TxID, first.Seq}
		}
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return schema
}

// The operator's path after a restore: the store refuses to start, a dry
// run reports and changes nothing, the repair lets it start, and a second
// repair is refused with exit code 3.
func TestRepairRestoredCluster(t *testing.T) {
	t.Parallel()
	env := []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + restoredSchema(t)}
	oneLine := func(r result, code int, msg string) {
		t.Helper()
		if r.code != code || !strings.Contains(r.stderr, msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Fatalf("want exit %d and one line containing %q: %+v", code, msg, r)
		}
	}

	oneLine(run(t, env, "status"), 1, "Run `projector repair restored-cluster` before starting")

	r := run(t, env, "repair", "restored-cluster", "--dry-run")
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("dry run: %+v", r)
	}
	for _, want := range []string{"restored from another cluster", "3 events, renumbered 2/1…2/3", "1 stream heads reset",
		"tickets", "2/1 ", "dry run: nothing changed"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("dry run output lacks %q:\n%s", want, r.stdout)
		}
	}
	oneLine(run(t, env, "status"), 1, "repair restored-cluster")

	r = run(t, env, "repair", "restored-cluster")
	if r.code != 0 || !strings.Contains(r.stdout, "repaired in") || !strings.Contains(r.stdout, "2/1 ") {
		t.Fatalf("repair: %+v", r)
	}
	r = run(t, env, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "tickets") || !strings.Contains(r.stdout, "2/1 ") {
		t.Fatalf("status after the repair: %+v", r)
	}

	oneLine(run(t, env, "repair", "restored-cluster"), 3, "does not need a restored-cluster repair")
	r = run(t, env, "repair", "restored-cluster", "--force", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "renumbering anyway (--force)") {
		t.Fatalf("forced dry run: %+v", r)
	}
}

// A session holding Projector's tables makes the repair give up within its
// lock timeout with exit code 1 and a message that says what to stop.
func TestRepairBusyTables(t *testing.T) {
	t.Parallel()
	schema := restoredSchema(t)
	tx, err := pgtest.Pool(t).Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(context.Background(), `LOCK TABLE `+pgx.Identifier{schema, "projector_consumers"}.Sanitize()+` IN ROW SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	r := run(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + schema}, "repair", "restored-cluster", "--lock-timeout", "100ms")
	if r.code != 1 || !strings.Contains(r.stderr, "stop every dispatcher") {
		t.Fatalf("repair with the tables in use: %+v", r)
	}
}

func TestRepairBadCommandLines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"unknown subcommand", []string{"repair", "bogus"}, "unknown command"},
		{"extra argument", []string{"repair", "restored-cluster", "extra"}, "unknown command"},
		{"zero lock timeout", []string{"repair", "restored-cluster", "--lock-timeout", "0s"}, "--lock-timeout"},
		{"malformed lock timeout", []string{"repair", "restored-cluster", "--lock-timeout", "soon"}, "lock-timeout"},
		{"unknown flag", []string{"repair", "restored-cluster", "--yes"}, "unknown flag"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(t, []string{"PROJECTOR_DATABASE_URL=postgres://127.0.0.1:1/x"}, tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.msg) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Fatalf("exit %d, want 2 and one line containing %q: %+v", r.code, tc.msg, r)
			}
		})
	}
}

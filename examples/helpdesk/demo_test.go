package helpdesk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestRunDemo(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	schema := demoSchema(t)
	err := helpdesk.RunDemo(context.Background(), pgtest.Pool(t), &out, helpdesk.DemoConfig{Schema: schema, Users: 4, Actions: 60})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"consumers caught up", "== Agent workload", "alice", "== Customer history", "== Welcome mails", "to ada <ada@example.com>", "live_counter", "T-0001 as of v1", "deleted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// demoSchema returns a schema name that does not exist yet, dropped when
// the test ends, in the pt_<unix>_ form the harness sweeps if the test is
// killed.
func demoSchema(t *testing.T) string {
	t.Helper()
	schema := fmt.Sprintf("pt_%d_demo%d", time.Now().Unix(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	return schema
}

// The demo drops and recreates the schema it created on an earlier run,
// and refuses one it did not create, leaving it as it was.
func TestRunDemoDropsOnlyItsOwnSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	cfg := helpdesk.DemoConfig{Schema: demoSchema(t), Users: 2, Actions: 10}
	for run := range 2 {
		var out bytes.Buffer
		if err := helpdesk.RunDemo(ctx, pool, &out, cfg); err != nil {
			t.Fatalf("run %d on the demo's own schema: %v\n%s", run+1, err, out.String())
		}
	}

	foreign := pgtest.Schema(t) // migrated, with Projector's tables, not the demo's
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{foreign, "precious"}.Sanitize()+` (v text)`); err != nil {
		t.Fatal(err)
	}
	err := helpdesk.RunDemo(ctx, pool, io.Discard, helpdesk.DemoConfig{Schema: foreign, Users: 2, Actions: 10})
	if !errors.Is(err, helpdesk.ErrNotDemoSchema) {
		t.Fatalf("demo on a schema it did not create: %v, want ErrNotDemoSchema", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, foreign).Scan(&n); err != nil || n < 4 {
		t.Fatalf("the foreign schema lost tables: %d left, %v", n, err)
	}
	// A schema an older demo left, before schemas were marked: Projector's
	// tables and the helpdesk's, nothing else. It is the demo's to replace.
	older := pgtest.Schema(t)
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	app, err := helpdesk.NewApp(types, older, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := helpdesk.RunDemo(ctx, pool, io.Discard, helpdesk.DemoConfig{Schema: older, Users: 2, Actions: 10}); err != nil {
		t.Fatalf("demo on an older demo's unmarked schema: %v", err)
	}
	for _, bad := range []helpdesk.DemoConfig{{Users: -1}, {Actions: -5}, {Users: helpdesk.MaxDemoUsers + 1}} {
		bad.Schema = cfg.Schema
		if err := helpdesk.RunDemo(ctx, pool, io.Discard, bad); err == nil {
			t.Errorf("demo with %+v accepted", bad)
		}
	}
}

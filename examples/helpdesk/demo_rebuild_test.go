package helpdesk_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
)

// The demo's "== Rebuild" section rolls agent_workload v2 out blue/green:
// afterwards the live tables are version 2's (each agent's open count is the
// tickets the inline summary has assigned to them and open, which version 1
// gets wrong for reassigned tickets), the rebuild is recorded switched with
// its lock time, and neither its shadow nor its old schema is left behind.
func TestDemoRebuildsWorkloadBlueGreen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := demoSchema(t)
	var out bytes.Buffer
	if err := helpdesk.RunDemo(ctx, pool, &out, helpdesk.DemoConfig{Schema: schema, Users: 4, Actions: 80}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{"== Rebuild", "rebuild 1 of agent_workload v2 requested", "switched: version 2 is live", "dropped"} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q:\n%s", want, text)
		}
	}
	if !regexp.MustCompile(`(?m)^rebuild agent_workload: building, \d+/\d+ events \(\d+%\)$`).MatchString(text) {
		t.Errorf("no plain progress line (the output is not a terminal):\n%s", text)
	}
	m := regexp.MustCompile(`version 2 counts (\d+) open tickets = (\d+) assigned`).FindStringSubmatch(text)
	if m == nil || m[1] != m[2] {
		t.Errorf("version 2's total is not the summary's: %q", m)
	}

	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
			SELECT agent, open FROM `+q(helpdesk.WorkloadTable)+` WHERE open <> 0
			EXCEPT SELECT agent, count(*) FROM `+q(helpdesk.SummaryTable)+` WHERE status = 'assigned' GROUP BY agent) x`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Errorf("%d agents' open counts differ from the tickets assigned to them", wrong)
	}
	var version int
	var status string
	var switchMS float64
	if err := pool.QueryRow(ctx, `SELECT c.version, r.status, r.switch_ms FROM `+q("projector_consumers")+` c, `+q("projector_rebuilds")+` r
		WHERE c.name = 'agent_workload' AND c.instance_id = '__shared__' AND r.id = 1`).Scan(&version, &status, &switchMS); err != nil {
		t.Fatal(err)
	}
	if version != 2 || status != "switched" || switchMS <= 0 {
		t.Errorf("live version %d, rebuild %s after %vms; want 2, switched, a measured switch", version, status, switchMS)
	}
	if n := rebuildSchemas(t, schema); len(n) != 0 {
		t.Errorf("the demo left rebuild schemas: %v", n)
	}
}

// A demo stopped half-way through its rebuild leaves the shadow (or old)
// schema; the next run drops it, as it drops its own schema, so its own
// rebuild 1 does not collide. A schema by that name holding anything but
// helpdesk tables is not the demo's and stays.
func TestDemoDropsRebuildLeftovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := demoSchema(t)
	cfg := helpdesk.DemoConfig{Schema: schema, Users: 2, Actions: 10}
	if err := helpdesk.RunDemo(ctx, pool, &bytes.Buffer{}, cfg); err != nil {
		t.Fatal(err)
	}
	leftover, foreign := schema+"_rebuild_1", schema+"_rebuild_2_old"
	t.Cleanup(func() {
		for _, s := range []string{leftover, foreign} {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}
	})
	for _, sql := range []string{
		`CREATE SCHEMA ` + pgx.Identifier{leftover}.Sanitize(),
		`CREATE TABLE ` + pgx.Identifier{leftover, helpdesk.WorkloadTable}.Sanitize() + ` (agent text PRIMARY KEY, open int, closed int)`,
		`CREATE SCHEMA ` + pgx.Identifier{foreign}.Sanitize(),
		`CREATE TABLE ` + pgx.Identifier{foreign, "precious"}.Sanitize() + ` (v text)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := helpdesk.RunDemo(ctx, pool, &out, cfg); err != nil {
		t.Fatalf("demo after a half-way rebuild: %v\n%s", err, out.String())
	}
	if pgtest.SchemaExists(t, leftover) {
		t.Errorf("the leftover shadow schema %s is still there", leftover)
	}
	if !pgtest.SchemaExists(t, foreign) {
		t.Errorf("the demo dropped %s, which holds a table that is not the helpdesk's", foreign)
	}
}

// rebuildSchemas lists the schemas rebuilds of schema made.
func rebuildSchemas(t *testing.T, schema string) []string {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(context.Background(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1) ORDER BY 1`, schema+"_rebuild_")
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

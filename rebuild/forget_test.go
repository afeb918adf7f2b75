package rebuild_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// customerModel copies the customers' personal fields into the declared
// table, named schema-qualified as most applications name theirs, and
// forgets subjects with the one-line helper, for the same table name.
func customerModel(types testevents.PersonalTypes, table string, version int) *projection.Async {
	p := projection.NewAsync("customers", projection.AsyncConfig{Version: version, Tables: []string{table}})
	must(projection.On(p, types.Registered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.CustomerRegistered) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, table)+` (tenant_id, id, customer, name, email, plan) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (tenant_id, id) DO UPDATE SET name = EXCLUDED.name, email = EXCLUDED.email, plan = EXCLUDED.plan`,
			ev.Stream.Tenant, ev.Stream.ID, c.Customer, nullable(c.Name), nullable(c.Email), c.Plan)
		return err
	}))
	must(projection.OnForgotten(p, projection.ForgetRows{Table: table, SubjectColumn: "customer", TenantColumn: "tenant_id"}))
	return p
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// `rebuild --diff` after a forget shows no personal data coming back
// (promise 19, issue 26): neither a rebuild that was built and held before
// the forget and kept up with it, nor one requested after it (a replay of
// the whole log) holds or shows any of the forgotten subject's personal
// values; the other subject's row is intact, and the switch would change
// nothing.
func TestDiffAfterForgetShowsNoPersonalData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("diff", testevents.MasterKey("diff"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	schema := store.Schema()
	table := schema + ".customers"
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "customers"}.Sanitize()+` (
		tenant_id text, id text, customer text NOT NULL, name text, email text, plan text NOT NULL, PRIMARY KEY (tenant_id, id))`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropRebuildSchemas(t, schema) })
	register := func(customer, stream, plan string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", stream), projector.AnyVersion,
				testevents.CustomerRegistered{Customer: customer, Name: "Name of " + stream, Email: stream + "@mail.example", Plan: plan})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	register("c-a", "a-1", "pro")
	register("c-a", "a-2", "free")
	register("c-b", "b-1", "pro")
	// The forgotten subject's every personal value holds one of these.
	leaked := func(text string) bool {
		return strings.Contains(text, "Name of a-") || strings.Contains(text, "a-1@") || strings.Contains(text, "a-2@")
	}

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := startDispatcher(t, store, projection.Config{}, customerModel(types, table, 1)).CatchUp(cctx); err != nil {
		t.Fatal(err)
	}
	startDispatcher(t, store, projection.Config{}, customerModel(types, table, 2))

	// A rebuild held before the forget has copied the subject's data into
	// its shadow table; it must forget too.
	if _, err := rebuild.Request(ctx, store, "customers", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	rb := waitReadyOf(t, store, "customers")
	if got := shadowRows(t, store, rb.ShadowSchema); !leaked(got) {
		t.Fatalf("the held shadow table does not hold the subject's data before the forget, the test proves nothing: %s", got)
	}
	res, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-a"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		var d rebuild.Difference
		eventually(t, time.Minute, "both models to pass the forget", func() bool {
			var err error
			d, err = rebuild.Diff(ctx, store, "customers", 100)
			if err != nil {
				t.Fatal(err)
			}
			return d.EventsBetween == 0 && !d.LiveCursor.Less(res.Event.Position) && !d.ShadowCursor.Less(res.Event.Position)
		})
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		shadow := shadowRows(t, store, d.Rebuild.ShadowSchema)
		switch {
		case leaked(string(out)):
			t.Fatalf("%s: the diff shows the forgotten subject's personal data: %s", when, out)
		case leaked(shadow):
			t.Fatalf("%s: the shadow table holds the forgotten subject's personal data: %s", when, shadow)
		case !d.Same():
			t.Fatalf("%s: the switch would change the model: %s", when, out)
		case shadow != `[{"id": "b-1", "name": "Name of b-1", "plan": "pro", "email": "b-1@mail.example", "customer": "c-b", "tenant_id": "acme"}]`:
			t.Fatalf("%s: shadow table %s", when, shadow)
		}
	}
	check("a rebuild held across the forget")

	// A rebuild requested after the forget replays the subject's events,
	// whose personal fields read as forgotten, and then the forget.
	if err := rebuild.Cancel(ctx, store, "customers"); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(ctx, store, "customers", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	waitReadyOf(t, store, "customers")
	check("a rebuild requested after the forget")
}

// waitReadyOf waits for the projection's rebuild to be held at ready.
func waitReadyOf(t *testing.T, store *postgres.Store, name string) rebuild.Rebuild {
	t.Helper()
	var rb rebuild.Rebuild
	eventually(t, time.Minute, name+"'s rebuild to be ready", func() bool {
		var err error
		rb, err = rebuild.Current(context.Background(), store, name)
		return err == nil && rb.Status == rebuild.Ready
	})
	return rb
}

// shadowRows returns the shadow customers table as a JSON array.
func shadowRows(t *testing.T, store *postgres.Store, shadowSchema string) string {
	t.Helper()
	var s string
	if err := store.Pool().QueryRow(context.Background(), `SELECT coalesce(jsonb_agg(to_jsonb(c) ORDER BY id), '[]')::text FROM `+
		pgx.Identifier{shadowSchema, "customers"}.Sanitize()+` c`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// dropRebuildSchemas drops the shadow and old schemas of the store's
// rebuilds (a test's cleanup).
func dropRebuildSchemas(t *testing.T, schema string) {
	rows, err := pgtest.Pool(t).Query(context.Background(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, schema+"_rebuild_")
	if err != nil {
		return
	}
	names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	for _, n := range names {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
	}
}

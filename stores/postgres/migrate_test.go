package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/migrations"
	"github.com/projectorhq/projector/stores/postgres"
)

// Several processes migrating one schema at once: the advisory lock makes
// them take turns, every migration runs once and all of them succeed.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := "pt_migrate_" + t.Name()[len(t.Name())-5:]
	pool := pgtest.NewPool(t, 8)
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	applied := make([][]int, 6)
	errs := make([]error, 6)
	for i := range applied {
		wg.Go(func() { applied[i], errs[i] = postgres.Migrate(ctx, pool, schema) })
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
		total += len(applied[i])
	}
	if total != len(all) {
		t.Fatalf("%d migrations applied in total, want %d (each exactly once)", total, len(all))
	}
	status, err := postgres.MigrationStatus(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range status {
		if !m.Applied() {
			t.Errorf("migration %d not applied", m.Version)
		}
	}
	if again, err := postgres.Migrate(ctx, pool, schema); err != nil || len(again) != 0 {
		t.Fatalf("second migrate: applied %v, err %v", again, err)
	}
}

func TestMigrationStatusOfEmptySchema(t *testing.T) {
	t.Parallel()
	status, err := postgres.MigrationStatus(context.Background(), pgtest.Pool(t), "pt_nothing_here")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range status {
		if m.Applied() {
			t.Errorf("migration %d reported applied in a schema that does not exist", m.Version)
		}
	}
	if _, err := postgres.Migrate(context.Background(), pgtest.Pool(t), "1bad"); err == nil {
		t.Fatal("Migrate accepted schema name 1bad")
	}
	// A system schema: migrate into information_schema created the store's
	// 83 tables there (a hostile-input audit); pg_ names are PostgreSQL's.
	for _, name := range []string{"information_schema", "pg_catalog", "pg_toast", "pg_mine"} {
		if _, err := postgres.Migrate(context.Background(), pgtest.Pool(t), name); err == nil || !strings.Contains(err.Error(), "system schema") {
			t.Errorf("Migrate into %s: %v, want a refusal naming a system schema", name, err)
		}
	}
	var n int
	if err := pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'information_schema' AND tablename LIKE 'projector_%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d projector tables in information_schema (%v)", n, err)
	}
}

// Migrate at start-up, as getting-started.md shows it, by an application
// role that may not change the schema: nothing to apply is success (it
// failed on CREATE TABLE IF NOT EXISTS, which asks for the privilege even
// when the table is there), and something to apply fails saying to run it
// as the owner (a least-privilege deployment drill).
func TestMigrateAsAnApplicationRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	app, _ := pgtest.AppRole(t, schema)
	appPool := pgtest.PoolAs(t, app, false, 2)
	applied, err := postgres.Migrate(ctx, appPool, schema)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Migrate of an up-to-date schema as the application role: %v, %v; want nothing applied, no error", applied, err)
	}
	if _, err := pgtest.Pool(t).Exec(ctx, `DELETE FROM `+pgx.Identifier{schema, "projector_migrations"}.Sanitize()+` WHERE version = 29`); err != nil {
		t.Fatal(err)
	}
	_, err = postgres.Migrate(ctx, appPool, schema)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(err.Error(), "run the migrations as the schema's owner") {
		t.Fatalf("Migrate with one pending as the application role: %v; want a permission error saying to run it as the owner", err)
	}
	// A schema it may not create: the same advice, at CREATE SCHEMA.
	if _, err := postgres.Migrate(ctx, appPool, schema+"_new"); !errors.As(err, &pgErr) || pgErr.Code != "42501" ||
		!strings.Contains(err.Error(), "run the migrations as the schema's owner") {
		t.Fatalf("Migrate into a new schema as the application role: %v; want a permission error saying to run it as the owner", err)
	}
}

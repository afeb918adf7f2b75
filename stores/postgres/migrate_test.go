package postgres_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

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
}

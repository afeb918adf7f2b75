package pgtest

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { Main(m) }

// The sweeper finds the leftovers of every kind of schema the suite makes —
// not only pgtest.Schema's pt_<unix>_… — once they are old enough, and
// leaves young ones (a running test's) alone.
func TestDropStaleFindsEveryTestSchemaKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := Pool(t)
	hour := strconv.FormatInt(time.Now().Add(-2*time.Hour).Unix(), 10)
	suffix := randomHex(4)
	old := []string{
		"pt_" + hour + "_" + suffix,         // pgtest.Schema, ExampleDatabase
		"pt_cli_" + hour + "_" + suffix,     // SchemaName(t, "cli")
		"pt_cli_" + suffix[:6] + "123",      // an older fixed-name test: aged by its migrations
		"pt_migrate_" + suffix,              // TestMigrateConcurrently's kind of name
		"projector_bench_" + suffix + "old", // `projector bench`, aged by its migrations
	}
	young := []string{
		"pt_cli_" + strconv.FormatInt(time.Now().Unix(), 10) + "_" + suffix,
		"pt_young_" + suffix,
		"projector_bench_" + suffix + "new",
	}
	for _, name := range append(slices.Clone(old), young...) {
		if _, err := postgres.Migrate(ctx, pool, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		})
	}
	// Names without a time are aged by their first migration: back-date
	// those of the old ones (the bench one by more than its day).
	for _, name := range old[2:] {
		age := "2 hours"
		if name == old[4] {
			age = "25 hours"
		}
		if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{name, "projector_migrations"}.Sanitize()+` SET applied_at = now() - $1::interval`, age); err != nil {
			t.Fatal(err)
		}
	}
	// A bench schema two hours old is still young: a long run may use it.
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{young[2], "projector_migrations"}.Sanitize()+` SET applied_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}

	stale := staleSchemas(ctx, pool, time.Now())
	for _, name := range old {
		// Another package's test binary starting meanwhile sweeps the
		// cluster too: a stale schema it already dropped was swept.
		if !slices.Contains(stale, name) && SchemaExists(t, name) {
			t.Errorf("stale schema %s not swept", name)
		}
	}
	for _, name := range young {
		if slices.Contains(stale, name) {
			t.Errorf("young schema %s would be swept", name)
		}
	}

	dropStale(ctx, pool)
	for _, name := range old {
		if SchemaExists(t, name) {
			t.Errorf("stale schema %s still there after dropStale", name)
		}
	}
	for _, name := range young {
		if !SchemaExists(t, name) {
			t.Errorf("young schema %s was dropped", name)
		}
	}
}

// A schema reserved with SchemaName is dropped when its test ends, even
// though the test's context is already cancelled by then.
func TestSchemaNameDroppedAfterTest(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("user", func(t *testing.T) {
		name = SchemaName(t, "cli")
		if !stampedSchema.MatchString(name) {
			t.Errorf("SchemaName %q carries no creation time for the sweeper", name)
		}
		if _, err := postgres.Migrate(t.Context(), Pool(t), name); err != nil {
			t.Fatal(err)
		}
	})
	if SchemaExists(t, name) {
		t.Errorf("schema %s outlived its test", name)
	}
}

package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkSchemaCost measures what each test's schema costs the suite:
// migrating a fresh one (Schema, Store) and dropping it at clean-up
// (docs/performance.md, Test suite wall time).
func BenchmarkSchemaCost(b *testing.B) {
	pool := Pool(b)
	ctx := context.Background()
	b.Run("migrate", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			name := SchemaName(b, "cost")
			if _, err := postgres.Migrate(ctx, pool, name); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("drop", func(b *testing.B) {
		names := make([]string, b.N)
		b.StopTimer()
		for i := range names {
			names[i] = SchemaName(b, "costd")
			if _, err := postgres.Migrate(ctx, pool, names[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for _, n := range names {
			if _, err := pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`); err != nil {
				b.Fatal(err)
			}
		}
	})
}

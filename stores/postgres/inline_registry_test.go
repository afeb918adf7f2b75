package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// An inline projection that cannot list its types and version
// (postgres.RecordedInline) is applied by its store but not recorded, so it
// fences no other store; projection.Inline's recording is tested in
// projection/inline_test.go.
func TestInlineProjectionWithoutTypesNotRecorded(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	table := pgx.Identifier{schema, "counts"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (stream_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	withCount, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{&countInline{table: table}}})
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM `+withCount.Table("projector_inline_projections")); n != 0 {
		t.Errorf("%d inline projections recorded; want none", n)
	}
	other, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := other.Append(ctx, tx, projector.Stream("ticket", "t1"), projector.NoStream, testevents.TicketOpened{Title: "x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestInlineRefreshNegativeRefused(t *testing.T) {
	t.Parallel()
	_, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: pgtest.Schema(t), Registry: testevents.New().Registry, InlineRefresh: -time.Second})
	if err == nil {
		t.Fatal("store with a negative InlineRefresh started")
	}
}

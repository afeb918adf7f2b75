package projection_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Inline projections commit with the append, or not at all: a failing
// handler rolls back the events and the caller's own writes; a succeeding
// one is visible together with the events.
func TestInlineProjectionAtomicity(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	summary := pgx.Identifier{schema, "summary"}.Sanitize()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	for _, sql := range []string{
		`CREATE TABLE ` + summary + ` (id text PRIMARY KEY, title text NOT NULL, comments int NOT NULL DEFAULT 0, closed bool NOT NULL DEFAULT false)`,
		`CREATE TABLE ` + orders + ` (id text PRIMARY KEY)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	p := projection.NewInline("ticket_summary")
	must(projection.On(p, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketOpened) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+summary+` (id, title) VALUES ($1, $2)`, ev.Stream.ID, e.Title)
		return err
	}))
	must(projection.On(p, types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketCommented) error {
		if e.Body == "explode" {
			return errors.New("comment refused by the read model")
		}
		_, err := tx.Exec(ctx, `UPDATE `+summary+` SET comments = comments + 1 WHERE id = $1`, ev.Stream.ID)
		return err
	}))
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{p}})
	if err != nil {
		t.Fatal(err)
	}
	count := func(table string) (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` VALUES ('o1')`); err != nil {
			return err
		}
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t1"), projector.NoStream,
			testevents.TicketOpened{Title: "hello"}, testevents.TicketCommented{Body: "first"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var comments int
	if err := pool.QueryRow(ctx, `SELECT comments FROM `+summary+` WHERE id = 't1'`).Scan(&comments); err != nil || comments != 1 {
		t.Fatalf("summary after a good append: %d comments, %v", comments, err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` VALUES ('o2')`); err != nil {
			return err
		}
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t2"), projector.NoStream,
			testevents.TicketOpened{Title: "doomed"}, testevents.TicketCommented{Body: "explode"})
		return err
	})
	if err == nil {
		t.Fatal("append with a failing inline handler succeeded")
	}
	if n := count(summary); n != 1 {
		t.Errorf("summary has %d rows; the failed append's row must be gone", n)
	}
	if n := count(orders); n != 1 {
		t.Errorf("orders has %d rows; the caller's write in the failed transaction must be gone", n)
	}
	if n := count(store.Table("projector_events")); n != 2 {
		t.Errorf("%d events; the failed append's must be gone", n)
	}
}

func TestInlineProjectionValidatedAtStoreStart(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	p := projection.NewInline("bad")
	strangers := projector.NewRegistry()
	type stranger struct{}
	must(projection.OnEvent(p, projector.MustDefine[stranger](strangers, "stranger.arrived"),
		func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	_, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry, Inline: []postgres.InlineProjection{p}})
	if !errors.Is(err, projection.ErrInvalidDefinition) {
		t.Fatalf("store with an inline projection of an undefined type: %v", err)
	}
}

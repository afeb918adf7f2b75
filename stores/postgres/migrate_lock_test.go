package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestMigration29WaitsBoundedForTheEventsTable: the events table's first
// column added by a migration needs the table's exclusive lock, and the
// request queues every later append behind it. Behind a transaction that
// stays in the table, the migration gives up after its lock timeout with
// SQLSTATE 55P03, applies nothing, and appends go on meanwhile once it has;
// run again after that transaction ends, it applies.
func TestMigration29WaitsBoundedForTheEventsTable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, store := f.ctx, f.store
	pool := store.Pool()
	schema := store.Schema()
	stream := projector.Stream("ticket", "t-1")
	f.appendTx(t, stream, projector.AnyVersion, testevents.TicketOpened{Title: "before"})

	// The schema as migration 28 left it, events and all.
	for _, sql := range []string{
		`ALTER TABLE ` + store.Table("projector_events") + ` DROP COLUMN envelope`,
		`ALTER TABLE ` + store.Table("projector_events_archive") + ` DROP COLUMN envelope`,
		`DELETE FROM ` + store.Table("projector_migrations") + ` WHERE version = 29`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	hasColumn := func() bool {
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
			WHERE table_schema = $1 AND table_name = 'projector_events' AND column_name = 'envelope')`, schema).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// A long reader in the table.
	reader, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM `+store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Bounded here too, so a migration that waited without end fails the
	// test instead of hanging it.
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = postgres.Migrate(waitCtx, pool, schema)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || !strings.Contains(err.Error(), "0029_events_envelope") {
		t.Fatalf("migrate behind a reader: %v, want a lock timeout naming migration 29", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the migration waited %s for the lock", took)
	}
	if hasColumn() {
		t.Fatal("the failed migration left the column")
	}
	// Nothing queued behind it now: an append goes through.
	f.appendTx(t, stream, projector.AnyVersion, testevents.TicketCommented{Body: "during"})

	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	applied, err := postgres.Migrate(ctx, pool, schema)
	if err != nil || len(applied) != 1 || applied[0] != 29 || !hasColumn() {
		t.Fatalf("migrate after the reader ended: %v, %v (column: %v)", applied, err, hasColumn())
	}
	if evs, err := store.ReadStream(ctx, stream, postgres.StreamQuery{}); err != nil || len(evs) != 2 {
		t.Fatalf("read after the migration: %d events, %v", len(evs), err)
	}
}

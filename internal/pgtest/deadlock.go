package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// HoldForDeadlock begins a transaction on db that holds table (a quoted,
// qualified name) in SHARE mode, with a deadlock_timeout far longer than
// the server's: when the test later waits for a lock the other actor
// holds while that actor waits for table, the other's backend finds the
// cycle and is the one aborted. It returns the transaction, rolled back
// when the test ends if still open, and its backend's pid.
func HoldForDeadlock(t testing.TB, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, table string) (pgx.Tx, int32) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var holder int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	return tx, holder
}

// WaitTriedAgain waits, up to a minute, until some backend queues behind a
// lock of backend holder: the aborted actor trying again. returned reports
// the actor's result if it came back instead (a non-empty description),
// which fails the test: it recorded the conflict rather than trying again.
func WaitTriedAgain(t testing.TB, db postgres.DBTX, holder int32, returned func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !BlockedBy(t, db, holder) {
		if r := returned(); r != "" {
			t.Fatalf("it returned %s while the test held its lock; want it tried again", r)
		}
		if time.Now().After(deadline) {
			t.Fatal("it did not try again within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity
	}
}

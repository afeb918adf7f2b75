package rebuild_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// An inline rebuild whose batch loses a conflict with another transaction
// (here a real deadlock's victim) tries the batch again instead of failing
// the command (which left the rebuild in progress, its error recorded, for
// the operator to run again).
//
// The deadlock: the replayed handler waits at the gate while the test
// takes the shadow table in SHARE mode; let through, its INSERT waits for
// the test, which then asks for the rebuild's shard lock (held by the
// batch) with a far longer deadlock_timeout, so the batch's backend is the
// victim. Its next try waits for the shard lock the test now holds.
func TestInlineRebuildOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 3 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	e.settle()
	e.gate, e.entered = make(chan struct{}), make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}})
		done <- err
	}()
	select {
	case <-e.entered:
	case err := <-done:
		t.Fatalf("the rebuild ended before replaying: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the rebuild never replayed")
	}
	var shadow string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, e.schema+"_irb_").Scan(&shadow); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{shadow, "tickets"}.Sanitize()
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	var holder int32
	if err := tx.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `SET LOCAL deadlock_timeout = '60s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+table+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	close(e.gate)
	pgtest.WaitForLockOn(t, e.store.Pool(), table) // the batch holds its shard lock and waits at the INSERT
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: "tickets", Instance: projection.RebuildInstance}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the rebuild's batch aborted", err)
	}
	deadline := time.Now().Add(time.Minute)
	for !pgtest.BlockedBy(t, e.store.Pool(), holder) {
		select {
		case err := <-done:
			t.Fatalf("the rebuild returned (%v) while the test held its shard lock; want the batch tried again", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the rebuild did not try its batch again within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling pg_stat_activity
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		var pgErr interface{ SQLState() string }
		if errors.As(err, &pgErr) {
			t.Fatalf("rebuild: %v (SQLSTATE %s); want it done", err, pgErr.SQLState())
		}
		t.Fatalf("rebuild: %v; want it done", err)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs from the reference in %d rows", d)
	}
}

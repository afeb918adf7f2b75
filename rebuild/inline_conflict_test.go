package rebuild_test

import (
	"fmt"
	"testing"

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
	done := e.rebuildToGate(rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}})
	var shadow string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, e.schema+"_irb_").Scan(&shadow); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{shadow, "tickets"}.Sanitize()
	tx, holder := pgtest.HoldForDeadlock(t, e.store.Pool(), table)
	close(e.gate)
	pgtest.WaitForLockOn(t, e.store.Pool(), table) // the batch holds its shard lock and waits at the INSERT
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: "tickets", Instance: projection.RebuildInstance}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the rebuild's batch aborted", err)
	}
	pgtest.WaitTriedAgain(t, e.store.Pool(), holder, func() string {
		select {
		case err := <-done:
			return fmt.Sprintf("(%v)", err)
		default:
			return ""
		}
	})
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("rebuild: %v; want it done", err)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs from the reference in %d rows", d)
	}
}

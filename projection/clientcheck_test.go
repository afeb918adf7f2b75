package projection_test

import (
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// A dispatcher killed while its handler waits for a lock does not leave
// its backend behind holding the shard's lock until the wait ends: the
// pass's backend checks its client every second (clientcheck.SQL) and ends.
// Without the check it waited for as long as the test held the table, and
// the shard could not be taken over by another process meanwhile.
func TestKilledDispatchersWaitingBackendEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	counts := e.table("counts")
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+counts+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	e.appendOne("k", projector.NoStream, testevents.TicketOpened{Title: "waits"})
	child := e.startChild(pgtest.URL(t), 10)
	pgtest.WaitForLockOn(t, e.store.Pool(), counts) // the child's counting pass waits for the table
	child.Kill(t)
	if !pgtest.NoLockWaitersWithin(t, e.store.Pool(), counts, 20*time.Second) {
		t.Fatal("the killed dispatcher's backend still waits for the table 20 s after the kill, holding its shard's lock")
	}
	// Its shard's lock went with it: the test can take it while it still
	// holds the table.
	var free bool
	if err := tx.QueryRow(e.ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))`, projection.ShardLockKey(e.schema, projection.ShardID{Consumer: "counting", Instance: projection.SharedInstance})).Scan(&free); err != nil {
		t.Fatal(err)
	}
	if !free {
		t.Fatal("the counting shard's lock is still held after the killed dispatcher's backend ended")
	}
}

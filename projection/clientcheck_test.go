package projection_test

import (
	"strconv"
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

// A direct retry (`dead-letters retry --here`, projection.RetryDeadLetter)
// killed while its handler waits for a lock does not leave its backend
// holding the shard's lock until the wait ends, which would stop every
// pass of the shard: LockShard sets the client check as a pass does.
func TestKilledRetrysWaitingBackendEnds(t *testing.T) {
	t.Parallel()
	e, _, _, ids := deadLetterEnv(t)
	trace := e.table("trace")
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+trace+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	child := e.startChild(pgtest.URL(t), 10, childRetry+"="+strconv.FormatInt(ids[0], 10))
	pgtest.WaitForLockOn(t, e.store.Pool(), trace) // the retry's handler waits for the table
	child.Kill(t)
	if !pgtest.NoLockWaitersWithin(t, e.store.Pool(), trace, 20*time.Second) {
		t.Fatal("the killed retry's backend still waits for the table 20 s after the kill, holding the shard's lock")
	}
	var free bool
	if err := tx.QueryRow(e.ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))`, projection.ShardLockKey(e.schema, projection.ShardID{Consumer: "tolerant", Instance: projection.SharedInstance})).Scan(&free); err != nil {
		t.Fatal(err)
	}
	if !free {
		t.Fatal("the tolerant shard's lock is still held after the killed retry's backend ended")
	}
	if dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0]); err != nil || dl.Status != projection.DeadLetterOpen || dl.Attempts != 1 {
		t.Fatalf("dead letter after the killed retry: %+v, %v; want it open as before", dl, err)
	}
}

package projection_test

import (
	"fmt"
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
	e.appendOne("k", projector.NoStream, testevents.TicketOpened{Title: "waits"})
	e.killWhileWaiting("counts", "counting", "dispatcher")
}

// A direct retry (`dead-letters retry --here`, projection.RetryDeadLetter)
// killed while its handler waits for a lock does not leave its backend
// holding the shard's lock until the wait ends, which would stop every
// pass of the shard: LockShard sets the client check as a pass does.
func TestKilledRetrysWaitingBackendEnds(t *testing.T) {
	t.Parallel()
	e, _, _, ids := deadLetterEnv(t)
	e.killWhileWaiting("trace", "tolerant", "retry", childRetry+"="+strconv.FormatInt(ids[0], 10))
	if dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0]); err != nil || dl.Status != projection.DeadLetterOpen || dl.Attempts != 1 {
		t.Fatalf("dead letter after the killed retry: %+v, %v; want it open as before", dl, err)
	}
}

// killWhileWaiting holds table in SHARE mode, starts a child (mode: its
// extra environment) whose handler of consumer's shared shard then waits
// for the table, SIGKILLs it, and fails unless the child's backend stops
// waiting within 20 s and the shard's lock is free while the test still
// holds the table. what names the child in failures.
func (e *env) killWhileWaiting(table, consumer, what string, mode ...string) {
	e.t.Helper()
	held := e.table(table)
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+held+` IN SHARE MODE`); err != nil {
		e.t.Fatal(err)
	}
	child := e.startChild(pgtest.URL(e.t), 10, mode...)
	pgtest.WaitForLockOn(e.t, e.store.Pool(), held) // the child's handler waits for the table
	child.Kill(e.t)
	if !pgtest.NoLockWaitersWithin(e.t, e.store.Pool(), held, 20*time.Second) {
		e.t.Fatalf("the killed %s's backend still waits for the table 20 s after the kill, holding its shard's lock", what)
	}
	// Its shard's lock went with it: the test can take it while it still
	// holds the table. A live dispatcher of the consumer (deadLetterEnv's)
	// may hold it for a pass of its own at that moment, never for long;
	// the dead backend held it for as long as the table was held.
	key := projection.ShardLockKey(e.schema, projection.ShardID{Consumer: consumer, Instance: projection.SharedInstance})
	pgtest.Eventually(e.t, 10*time.Second, fmt.Sprintf("the %s shard's lock free after the killed %s's backend ended", consumer, what), func() bool {
		var free bool
		if err := tx.QueryRow(e.ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))`, key).Scan(&free); err != nil {
			e.t.Fatal(err)
		}
		return free
	})
}

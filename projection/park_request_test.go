package projection_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// A retry request the dispatcher carries out, whose transaction PostgreSQL
// aborts as a deadlock's victim, stays requested: nothing of the retry
// committed, and the next look carries it out. (It used to be cleared, with
// the deadlock as the park's error, and the operator had to request it
// again.) The deadlock is made for it: the test holds the parked events
// table in SHARE mode, so the retry, holding the shard's lock, waits at
// its DELETE of the sequence; the test then asks for the shard's lock, and
// with its own deadlock_timeout far longer, the retry's backend finds the
// cycle and is the one aborted. The same with the handler's trace table
// held, so the deadlock strikes the handler's INSERT: that was recorded as
// the retry's failure (attempt counted, request cleared) until requested
// retries returned a handler's class-40 failure as the transaction's.
func TestParkRetryRequestOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	for _, held := range []string{"projector_parked_events", "trace"} {
		t.Run(held, func(t *testing.T) {
			t.Parallel()
			parkRetryRequestOutlivesADeadlock(t, held)
		})
	}
}

func parkRetryRequestOutlivesADeadlock(t *testing.T, held string) {
	e := newEnv(t)
	_, pk, failing := e.parkedPoison()
	failing.Store(false)

	tx, holder := e.holdForDeadlock(t, held)
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := projection.RequestParkRetry(e.ctx, e.store, pk.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the dispatcher's retry to wait at the held table's lock", func() bool {
		return pgtest.BlockedBy(t, e.store.Pool(), holder)
	})
	// The cycle: the retry holds the shard's lock and waits for the table;
	// the test holds the table and waits for the shard's lock.
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: pk.Consumer, Instance: pk.Instance}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the dispatcher's retry aborted", err)
	}
	// The retry was aborted and gave the shard's lock back. Its request
	// must still be there: the dispatcher's next look waits at the table
	// again (or has not looked yet).
	got, _, err := projection.GetPark(e.ctx, e.store, pk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != projection.ParkOpen {
		t.Fatalf("park while the test holds the table: %+v; want it open", got)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the retry request carried out or dropped", func() bool {
		if got, _, err = projection.GetPark(e.ctx, e.store, pk.ID); err != nil {
			t.Fatal(err)
		}
		return got.Status != projection.ParkOpen || got.RetryRequestedAt == nil
	})
	if got.Status != projection.ParkResolved {
		t.Fatalf("park after the deadlock: status %s, error %q; want the request kept and carried out", got.Status, got.Error)
	}
	if strings.Contains(got.Error, "deadlock") {
		t.Errorf("park error %q: a retry the deadlock aborted was recorded as its failure", got.Error)
	}
	if n := e.traced("parking", pk.EventID); n != 1 {
		t.Fatalf("the parked event was applied %d times, want 1", n)
	}
}

// The dead-letter twin of TestParkRetryRequestOutlivesADeadlock: a retry
// request of a dead letter whose transaction PostgreSQL aborts as a
// deadlock's victim stays requested (retryLater) and is carried out on a
// later look, once, with the deadlock recorded nowhere. The test holds the
// handler's trace table in SHARE mode, so the retry, holding the shard's
// lock, waits at the handler's INSERT; the test then asks for the shard's
// lock with a far longer deadlock_timeout, so the retry's backend finds the
// cycle and is the one aborted.
func TestDeadLetterRetryRequestOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	e, _, dl := healedDeadLetter(t)
	id := dl.ID
	tx, holder := e.holdForDeadlock(t, "trace")
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, []int64{id}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the dispatcher's retry to wait at the trace table's lock", func() bool {
		return pgtest.BlockedBy(t, e.store.Pool(), holder)
	})
	// The cycle: the retry holds the shard's lock and waits for the table;
	// the test holds the table and waits for the shard's lock.
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: dl.Consumer, Instance: dl.Instance}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the dispatcher's retry aborted", err)
	}
	// The retry was aborted and gave the shard's lock back; its request
	// must still be there for the next look.
	got, _, err := projection.GetDeadLetter(e.ctx, e.store, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != projection.DeadLetterOpen || got.RetryRequestedAt == nil || got.Attempts != dl.Attempts {
		t.Fatalf("dead letter while the test holds the table: %+v; want it open, still requested, no attempt counted", got)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the retry request carried out or dropped", func() bool {
		if got, _, err = projection.GetDeadLetter(e.ctx, e.store, id); err != nil {
			t.Fatal(err)
		}
		return got.Status != projection.DeadLetterOpen || got.RetryRequestedAt == nil
	})
	if got.Status != projection.DeadLetterResolved {
		t.Fatalf("dead letter after the deadlock: status %s, error %q; want the request kept and carried out", got.Status, got.Error)
	}
	if strings.Contains(got.Error, "deadlock") {
		t.Errorf("dead letter error %q: a retry the deadlock aborted was recorded as its failure", got.Error)
	}
	if n := e.traced("tolerant", dl.EventID); n != 1 {
		t.Fatalf("the dead letter's event was applied %d times, want 1", n)
	}
}

// A direct retry (RetryDeadLetter, `dead-letter retry --here`) aborted as a
// deadlock's victim in its handler is tried again, not recorded as the
// event's failure: the deadlock says nothing about the event. (It used to
// come back as a failed retry, "deadlock detected", with an attempt
// counted, and the operator retried by hand.) The deadlock is made as in
// TestDeadLetterRetryRequestOutlivesADeadlock; the retry's next try then
// waits for the shard's lock the test holds, and goes through once the
// test lets go.
func TestDeadLetterRetryHereOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	e, p, dl := healedDeadLetter(t)
	id := dl.ID
	tx, holder := e.holdForDeadlock(t, "trace")
	defer func() { _ = tx.Rollback(e.ctx) }()
	type result struct {
		res projection.RetryResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := projection.RetryDeadLetter(e.ctx, e.store, p, id, nil)
		done <- result{res, err}
	}()
	eventually(t, time.Minute, "the retry to wait at the trace table's lock", func() bool {
		return pgtest.BlockedBy(t, e.store.Pool(), holder)
	})
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: dl.Consumer, Instance: dl.Instance}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the retry aborted", err)
	}
	// The aborted try recorded nothing; the next one waits for the
	// shard's lock the test now holds.
	eventually(t, time.Minute, "the retry to try again and wait for the shard's lock", func() bool {
		return pgtest.BlockedBy(t, e.store.Pool(), holder)
	})
	select {
	case r := <-done:
		t.Fatalf("the retry returned (%+v, %v) while the test held the shard's lock; want it tried again", r.res, r.err)
	default:
	}
	got, _, err := projection.GetDeadLetter(e.ctx, e.store, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != projection.DeadLetterOpen || got.Attempts != dl.Attempts || strings.Contains(got.Error, "deadlock") {
		t.Fatalf("dead letter after the aborted try: %+v; want it open as before, no attempt counted", got)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.res.Resolved || r.res.Error != "" || r.res.Attempts != dl.Attempts+1 {
		t.Fatalf("retry: (%+v, %v); want it resolved on its next try, %d attempts", r.res, r.err, dl.Attempts+1)
	}
	if n := e.traced("tolerant", dl.EventID); n != 1 {
		t.Fatalf("the dead letter's event was applied %d times, want 1", n)
	}
}

// holdForDeadlock begins a transaction that holds table (of the test's
// schema) in SHARE mode, with a deadlock_timeout far longer than the
// server's, so that when it later waits for a lock the other actor holds
// while waiting for table, the other's backend finds the cycle and is the
// one aborted. It returns the transaction and its backend's pid.
func (e *env) holdForDeadlock(t *testing.T, table string) (pgx.Tx, int32) {
	t.Helper()
	return pgtest.HoldForDeadlock(t, e.store.Pool(), e.table(table))
}

// healedDeadLetter is deadLetterEnv with its handler healed: a retry of the
// dead letter it returns succeeds unless something else aborts it.
func healedDeadLetter(t *testing.T) (*env, *projection.Async, projection.DeadLetter) {
	t.Helper()
	e, p, failing, ids := deadLetterEnv(t)
	failing.Store(false)
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	return e, p, dl
}

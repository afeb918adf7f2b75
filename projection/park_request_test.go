package projection_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
// cycle and is the one aborted.
func TestParkRetryRequestOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, pk, failing := e.parkedPoison()
	failing.Store(false)

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
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+e.store.Table("projector_parked_events")+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	if err := projection.RequestParkRetry(e.ctx, e.store, pk.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the dispatcher's retry to wait at the parked events' lock", func() bool {
		return blocking(t, e.ctx, e.store.Pool(), uint32(holder))
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

// blocking reports whether a backend waits for a lock the backend pid
// holds: how these tests see that the other actor reached the gap they
// hold it in.
func blocking(t testing.TB, ctx context.Context, pool *pgxpool.Pool, pid uint32) bool {
	t.Helper()
	var waiting bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)))`,
		int32(pid)).Scan(&waiting)
	if err != nil {
		t.Fatal(err)
	}
	return waiting
}

package projection_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A merge holds a connection of its pool for its claims while it runs, so
// whatever it does after a refusal or a timeout (lifting holds, waking the
// dispatchers) must go through that connection too: on a pool of one
// connection, a second acquire would wait for the merge's own, for ever.
// Here the merge is refused (a disabled half) by an admin whose pool has a
// single connection, and must return the refusal, not hang.
func TestMergeOnAOneConnectionPoolReturns(t *testing.T) {
	t.Parallel()
	e, admin, closePool := oneConnectionMerge(t, "single")
	half := projection.ShardID{Consumer: "single", Instance: projection.PartitionInstance(1, 2)}
	if err := admin.Disable(e.ctx, half); err != nil {
		t.Fatal(err)
	}
	err := mergeWithin30s(t, admin, "single", time.Second, closePool)
	if !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("merge with a disabled half on a one-connection pool: %v, want ErrInvalidTransition", err)
	}
}

// The same on the timeout's path: one half stands behind its hold and no
// dispatcher runs, so the merge gives up after its wait and lifts the
// holds under the fence (unholdFenced) through the claims' connection. It
// returns the timeout, not hang, and leaves both halves unheld and the
// layout as it was.
func TestMergeTimingOutOnAOneConnectionPoolReturns(t *testing.T) {
	t.Parallel()
	e, admin, closePool := oneConnectionMerge(t, "lapsed")
	// The half 1/2 back at the start: the pair cannot be swapped at once,
	// and with no dispatcher running it never reaches the hold.
	e.exec(`UPDATE `+e.table("projector_consumers")+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = 'lapsed' AND instance_id = $1`,
		projection.PartitionInstance(1, 2))
	err := mergeWithin30s(t, admin, "lapsed", 300*time.Millisecond, closePool)
	if err == nil || errors.Is(err, projection.ErrLayoutChanged) {
		t.Fatalf("merge of a half that cannot reach its hold: %v, want its timeout", err)
	}
	if got := e.layout("lapsed"); len(got) != 2 {
		t.Fatalf("layout %v after a merge that timed out, want both halves", got)
	}
	if held := heldHalves(t, e, e.table("projector_consumers"), "lapsed")(); held != 0 {
		t.Fatalf("%d partitions still held after the merge timed out", held)
	}
}

// The same, with the wait's deadline falling while a look at the halves is
// under way: the look is held up by a lock on the consumers table taken by
// hand once the halves are held, and given back only once the deadline
// passed. The look must finish rather than be cancelled, for a statement
// cancelled midway closes its connection, the one holding the claims,
// through which the holds are lifted; the merge then waited for a second
// connection a pool of one never gives, and left both halves held (the
// test failed so, as the timeout test above did once under CI's load).
func TestMergeTimingOutDuringALookOnAOneConnectionPool(t *testing.T) {
	t.Parallel()
	e, admin, closePool := oneConnectionMerge(t, "looking")
	consumers := e.table("projector_consumers")
	e.exec(`UPDATE `+consumers+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = 'looking' AND instance_id = $1`,
		projection.PartitionInstance(1, 2))
	const wait = 500 * time.Millisecond
	started := time.Now()
	done := make(chan error, 1)
	go func() { done <- mergeWithin30s(t, admin, "looking", wait, closePool) }()
	held := heldHalves(t, e, consumers, "looking")
	tx := holdALook(t, e, consumers, held)
	defer func() { _ = tx.Rollback(e.ctx) }()
	// The deadline passes while the look waits: waiting on the clock is
	// the point here.
	time.Sleep(2*wait - time.Since(started))
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil || errors.Is(err, projection.ErrLayoutChanged) {
		t.Fatalf("merge of a half that cannot reach its hold: %v, want its timeout", err)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d partitions still held after the merge timed out during a look", n)
	}
}

// A merge cancelled by its caller (Ctrl-C of `consumer merge`) while a look
// at the halves is under way: the look is held up by a lock on the
// consumers table taken by hand once the halves are held, the caller's
// context is cancelled, and the lock given back. The merge must stop,
// lift the holds and return the cancellation promptly, on a pool of one
// connection too. Before, the cancellation cut the look midway, which
// closed the connection holding the claims; the holds were then to be
// lifted through a second connection the pool never gave, and both halves
// stayed held (standing still) until someone ran the merge again.
func TestMergeCancelledDuringALookLiftsTheHolds(t *testing.T) {
	t.Parallel()
	e, admin, closePool := oneConnectionMerge(t, "cancelled")
	consumers := e.table("projector_consumers")
	e.exec(`UPDATE `+consumers+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = 'cancelled' AND instance_id = $1`,
		projection.PartitionInstance(1, 2))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := admin.Merge(ctx, "cancelled", time.Hour)
		done <- err
	}()
	held := heldHalves(t, e, consumers, "cancelled")
	tx := holdALook(t, e, consumers, held)
	defer func() { _ = tx.Rollback(e.ctx) }()
	cancel()
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
		closePool()
	case <-time.After(30 * time.Second):
		t.Fatal("a cancelled merge did not return within 30 s")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled merge: %v, want context.Canceled", err)
	}
	if got := e.layout("cancelled"); len(got) != 2 {
		t.Fatalf("layout %v after a cancelled merge, want both halves", got)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d partitions still held after the merge was cancelled during a look", n)
	}
}

// oneConnectionMerge makes consumer, two partitions, caught up by a
// dispatcher that is stopped again, and an admin on a pool of one
// connection, which closePool closes.
func oneConnectionMerge(t *testing.T, consumer string) (e *env, admin *projection.Admin, closePool func()) {
	t.Helper()
	e = partitioned(t)
	p := countingThrough(e.schema, e.types, consumer, projection.AsyncConfig{Partitions: 2, BatchSize: 50}, nil)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	cfg := pgtest.PoolConfig(t)
	cfg.MaxConns = 1
	// Closed only once the merge returned: closing a pool waits for its
	// acquired connection, which a hung merge never gives back (the test
	// then fails at its deadline rather than hanging in its cleanup).
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	one, err := postgres.New(e.ctx, pool, postgres.Config{Schema: e.schema, Registry: e.types.Registry})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	return e, projection.NewAdmin(one), pool.Close
}

// mergeWithin30s runs admin's merge of consumer and returns its error,
// failing the test when it has not returned in 30 s; closePool runs once
// it returned.
func mergeWithin30s(t *testing.T, admin *projection.Admin, consumer string, wait time.Duration, closePool func()) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := admin.Merge(ctx, consumer, wait)
		done <- err
	}()
	select {
	case err := <-done:
		closePool()
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("merge on a one-connection pool did not return within 30 s (its own connection held while it waits for another)")
		return nil
	}
}

// heldHalves counts consumer name's partitions held by a merge.
func heldHalves(t *testing.T, e *env, consumers, name string) func() int {
	return func() int {
		var n int
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+consumers+` WHERE name = $1 AND hold_tx_id IS NOT NULL`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// holdALook waits until a merge holds both halves, then locks the
// consumers table in a transaction it returns, and waits until the merge's
// next look waits for it: the look is under way until tx ends.
func holdALook(t *testing.T, e *env, consumers string, held func() int) pgx.Tx {
	t.Helper()
	eventually(t, 30*time.Second, "the merge holds both halves", func() bool { return held() == 2 })
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+consumers+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		_ = tx.Rollback(e.ctx)
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a look waits for the table", func() bool {
		var waiting bool
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = $1::regclass)`, consumers).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	return tx
}

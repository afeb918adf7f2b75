package postgres_test

import (
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestRewrapNeverDeadlocksAppend: a transaction that appends for subject
// B, then for subject A, while a rewrap batch takes A and B, both commit.
// The transaction holds B's key row FOR SHARE (as every append sealing
// under a key does until it ends) when the batch starts; the test waits
// until the rewrap is blocked behind it, then appends for A. Before, the
// batch's UPDATE had locked A and waited for B, the append waited for A,
// and PostgreSQL failed one of them with a deadlock (40P01); now the batch
// never waits on a key row while holding another: it rewraps the rows it
// can lock at once and waits for each of the others in a transaction of its
// own.
func TestRewrapNeverDeadlocksAppend(t *testing.T) {
	t.Parallel()
	r := rotationSetup(t, 4) // batch 1 of 2 keys: acme/c-00 (A), acme/c-02 (B)
	ctx := r.ctx
	a, b := r.subs["acme/c-00"], r.subs["acme/c-02"]
	tx, err := r.store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	appendFor := func(c any, id string) error {
		_, err := r.both.Append(ctx, tx, projector.TenantStream("acme", "customer", id), projector.AnyVersion, c)
		return err
	}
	if err := appendFor(b, b.Customer); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		res postgres.RewrapResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.both.RewrapKeys(ctx, postgres.RewrapOptions{BatchSize: 2})
		done <- outcome{res, err}
	}()
	// The rewrap must wait for B's key row, which the open transaction
	// holds: wait until PostgreSQL shows a backend blocked by it.
	blocked := func() bool {
		var yes bool
		if err := r.store.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, pid).Scan(&yes); err != nil {
			t.Fatal(err)
		}
		return yes
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !blocked() {
		select {
		case o := <-done:
			t.Fatalf("the rewrap ended (%+v, %v) while the append held B's key row", o.res, o.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the rewrap never waited for the append's key row")
		}
		time.Sleep(5 * time.Millisecond) // polling the condition above
	}

	appendErr := appendFor(a, a.Customer)
	if appendErr == nil {
		appendErr = tx.Commit(ctx)
	}
	if appendErr != nil {
		t.Errorf("the append for B then A, racing the rewrap: %v", appendErr)
	}
	var o outcome
	select {
	case o = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the rewrap did not end within two minutes of the append")
	}
	if o.err != nil {
		t.Fatalf("the rewrap racing an append for B then A: %v", o.err)
	}
	if o.res.Rewrapped != 4 || o.res.Forgotten != 0 || o.res.Remaining != 0 {
		t.Fatalf("rewrap: %+v, want all 4 keys rewrapped", o.res)
	}
	if n := r.countWrappedBy(t, "k1"); n != 0 {
		t.Fatalf("%d keys still wrapped by k1", n)
	}
	r.checkAll(t, r.open(t, r.k2)) // the appended events too: they are the same customers
}

package projection_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestPartitionedPassDeadlocksWithTwoSubjectForget: a transaction that
// forgets two subjects (ForgetTx twice), the later in key order first,
// races a partition's pass that opened both. The pass's guard locks their
// key rows FOR SHARE in key order: it holds the first and waits for the
// second, which the forget has destroyed; the forget then waits for the
// first. PostgreSQL breaks the cycle by aborting one of them with 40P01,
// the one whose deadlock check (after its deadlock_timeout of waiting)
// finds it:
//
//   - the pass (the forget waits longer than the pass's 1s): the forget
//     commits, the dispatcher retries the pass after its backoff, which
//     reads the events forgotten;
//   - the forget (its deadlock_timeout short): it fails with 40P01 and
//     nothing of it is committed, neither subject forgotten nor any
//     forgotten event appended; the pass commits the names, and the
//     forget retried (in key order) forgets them.
//
// Either way nothing is lost or half done: after catch-up the model holds
// neither name. Which one PostgreSQL aborts depends on timing; a subtest
// that sees the other outcome checks that one and says so. A forget that
// destroys the keys in key order (tenant, subject), the order the guards
// lock them in, forms no cycle: the pass waits for it, then reads its
// batch again, forgotten.
func TestPartitionedPassDeadlocksWithTwoSubjectForget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, timeout string
		keyOrder      bool
		passVictim    bool
	}{
		{"pass aborted", "5s", false, true},
		{"forget aborted", "10ms", false, false},
		{"key order, no deadlock", "10ms", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			twoSubjectForgetRacingPass(t, c.timeout, c.keyOrder, c.passVictim)
		})
	}
}

// twoSubjectForgetRacingPass runs the race of
// TestPartitionedPassDeadlocksWithTwoSubjectForget with the forget's
// deadlock_timeout, its subjects in key order or the other way round.
// wantCommit says the forget is expected to commit (in key order, it
// must).
func twoSubjectForgetRacingPass(t *testing.T, deadlockTimeout string, keyOrder, wantCommit bool) {
	r := newForgetRace(t)
	// Two customers whose streams are in one partition, registered in one
	// transaction: one batch of one pass opens both. The pass holds at
	// the gate on the second (in key order), having opened the first.
	var first, second string
	for i := 0; second == ""; i++ {
		id := fmt.Sprintf("d-%03d", i)
		switch {
		case first == "":
			first = id
		case r.half("customer", id) == r.half("customer", first):
			second = id
		}
	}
	r.target = second
	g := r.gate()
	p := projection.NewAsync("customers", projection.AsyncConfig{Partitions: 2, Tables: []string{r.store.Schema() + ".customers"}})
	r.copyNames(p, g, nil, nil)
	d := (&env{t: t, ctx: r.ctx, store: r.store, schema: r.store.Schema()}).dispatcher(projection.Config{Projections: []*projection.Async{p}})
	r.register(first, second)
	var pass int32
	pgtest.Eventually(t, 30*time.Second, "the pass to wait at the gate", func() bool {
		var ok bool
		pass, ok = r.waiter(g)
		return ok
	})

	tx, err := r.pool.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(r.ctx) }()
	if _, err := tx.Exec(r.ctx, `SELECT set_config('deadlock_timeout', $1, true)`, deadlockTimeout); err != nil {
		t.Fatal(err)
	}
	forget := []string{second, first}
	if keyOrder {
		forget = []string{first, second}
	}
	if _, err := r.store.ForgetTx(r.ctx, tx, postgres.SubjectRef{Tenant: "acme", ID: forget[0]}); err != nil {
		t.Fatal(err)
	}
	g.release()
	forgetPID := tx.Conn().PgConn().PID()
	pgtest.Eventually(t, 30*time.Second, "the pass's guard to wait for the forget", func() bool {
		var waiting bool
		if err := r.pool.QueryRow(r.ctx, `SELECT $1::int = ANY(pg_blocking_pids($2))`, int32(forgetPID), pass).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	_, err = r.store.ForgetTx(r.ctx, tx, postgres.SubjectRef{Tenant: "acme", ID: forget[1]})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		if !keyOrder {
			t.Logf("the forget committed: PostgreSQL aborted the pass")
		}
		if !wantCommit {
			t.Logf("PostgreSQL aborted the pass, not the forget (its deadlock check ran first)")
		}
		if err := tx.Commit(r.ctx); err != nil {
			t.Fatal(err)
		}
	case errors.As(err, &pgErr) && pgErr.Code == "40P01":
		t.Logf("PostgreSQL aborted the forget: %v", err)
		if keyOrder {
			t.Fatalf("a forget in key order deadlocked with the pass: %v", err)
		}
		if wantCommit {
			t.Logf("PostgreSQL aborted the forget, not the pass (the pass's deadlock check ran before the forget waited): %v", err)
		}
		_ = tx.Rollback(r.ctx)
		r.forgetUndone(first, second)
		// The pass committed the names (the keys were there); a forget
		// retried forgets them.
		if err := pgx.BeginFunc(r.ctx, r.pool, func(tx pgx.Tx) error {
			for _, id := range []string{first, second} {
				if _, err := r.store.ForgetTx(r.ctx, tx, postgres.SubjectRef{Tenant: "acme", ID: id}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("the forget retried: %v", err)
		}
	default:
		t.Fatalf("the forget's second subject: %v; want it forgotten, or the deadlock (40P01) reported", err)
	}
	r.noNameAfterCatchUp(d, first)
}

// forgetUndone fails the test unless subjects ids are all still there: a
// key each, and no forgotten event in their streams.
func (r *forgetRace) forgetUndone(ids ...string) {
	r.t.Helper()
	var keys, events int
	if err := r.pool.QueryRow(r.ctx, `SELECT
			(SELECT count(*) FROM `+r.store.Table("projector_subject_keys")+` WHERE subject = ANY($1) AND wrapped IS NOT NULL),
			(SELECT count(*) FROM `+r.store.Table("projector_events")+` WHERE stream_type = $2 AND stream_id = ANY($1))`,
		ids, projector.SubjectStreamType).Scan(&keys, &events); err != nil {
		r.t.Fatal(err)
	}
	if keys != len(ids) || events != 0 {
		r.t.Fatalf("after the failed forget of %q: %d keys left, %d forgotten events; want every key and no event", ids, keys, events)
	}
}

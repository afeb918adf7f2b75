package projection_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// forgetRace is what the tests of a forget racing a write of a
// partitioned consumer share: a partitioned personal store, a customers
// read model, and a customer (target) whose stream and subject stream
// (where the forgotten event goes) hash into different halves, so two
// partitions of a consumer in two apply them.
type forgetRace struct {
	t         *testing.T
	ctx       context.Context
	types     testevents.PersonalTypes
	store     *postgres.Store
	pool      *pgxpool.Pool
	customers string
	target    string
}

func newForgetRace(t *testing.T) *forgetRace {
	t.Helper()
	types, store := partitionedPersonalStore(t)
	r := &forgetRace{t: t, ctx: context.Background(), types: types, store: store, pool: store.Pool(),
		customers: pgx.Identifier{store.Schema(), "customers"}.Sanitize()}
	if _, err := r.pool.Exec(r.ctx, `CREATE TABLE `+r.customers+` (tenant_id text, customer_id text, name text)`); err != nil {
		t.Fatal(err)
	}
	for i := 0; r.target == ""; i++ {
		if id := fmt.Sprintf("c-%d", i); r.half("customer", id) != r.half(projector.SubjectStreamType, id) {
			r.target = id
		}
	}
	return r
}

// half returns the partition of 2 that stream typ/id of tenant acme is in.
func (r *forgetRace) half(typ, id string) int {
	r.t.Helper()
	var h int64
	if err := r.pool.QueryRow(r.ctx, `SELECT `+pgx.Identifier{r.store.Schema(), "projector_stream_hash"}.Sanitize()+`($1, $2, $3)`,
		"acme", typ, id).Scan(&h); err != nil {
		r.t.Fatal(err)
	}
	return int(h >> 31)
}

// raceGate is an advisory lock the test holds on a connection of its own,
// so each is given back on its own and a transaction waiting at it is
// found by its blocker (pg_blocking_pids).
type raceGate struct {
	key      int64
	pid      uint32
	release  func()
	released bool
}

// gate takes a gate, given back when the test ends if not before.
func (r *forgetRace) gate() *raceGate {
	r.t.Helper()
	g := &raceGate{key: rand.Int64N(1<<62) + 1}
	conn, err := r.pool.Acquire(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := conn.Exec(r.ctx, `SELECT pg_advisory_lock($1)`, g.key); err != nil {
		conn.Release()
		r.t.Fatal(err)
	}
	g.pid = conn.Conn().PgConn().PID()
	g.release = func() {
		if !g.released {
			g.released = true
			if _, err := conn.Exec(r.ctx, `SELECT pg_advisory_unlock($1)`, g.key); err != nil {
				r.t.Error(err)
			}
			conn.Release()
		}
	}
	r.t.Cleanup(g.release)
	return g
}

// waiter returns the backend waiting at g, if one is.
func (r *forgetRace) waiter(g *raceGate) (int32, bool) {
	var pid int32
	err := r.pool.QueryRow(r.ctx, `SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, int32(g.pid)).Scan(&pid)
	return pid, err == nil
}

// copyNames makes p copy customers' names into the read model and forget
// them with OnForgotten. The target's event, read with its name, waits at
// g1 before the handler writes the name and at g2 after (a nil gate is
// not waited at); while failing
// (nil: never) says so, the handler fails on it instead.
func (r *forgetRace) copyNames(p *projection.Async, g1, g2 *raceGate, failing *atomic.Bool) {
	must(projection.On(p, r.types.Registered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.CustomerRegistered) error {
		held := ev.Stream.ID == r.target && !ev.Forgotten
		if held && failing != nil && failing.Load() {
			return errors.New("cannot take the customer yet")
		}
		if held && g1 != nil {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, g1.key); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+r.customers+` VALUES ($1, $2, $3)`, ev.Stream.Tenant, c.Customer, c.Name); err != nil {
			return err
		}
		if held && g2 != nil {
			_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, g2.key)
			return err
		}
		return nil
	}))
	must(projection.OnForgotten(p, projection.ForgetRows{Table: r.store.Schema() + ".customers", SubjectColumn: "customer_id", TenantColumn: "tenant_id"}))
}

// register appends the registrations of customers ids, with their
// names, in one transaction.
func (r *forgetRace) register(ids ...string) {
	r.t.Helper()
	if err := pgx.BeginFunc(r.ctx, r.pool, func(tx pgx.Tx) error {
		for _, id := range ids {
			if _, err := r.store.Append(r.ctx, tx, projector.TenantStream("acme", "customer", id), projector.AnyVersion,
				testevents.CustomerRegistered{Customer: id, Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		r.t.Fatal(err)
	}
}

// forgetWhileHeld forgets the target while a transaction of consumer
// (partitioned in 2) that read its event with the name holds at g1, and
// returns once the forget has committed. If the forget commits while that
// transaction holds (it may instead wait for it, which a guard makes it
// do), g1 is given back, the transaction writes the name and holds at g2
// until the subject's partition has applied the forgotten event, whose
// OnForgotten cannot see the uncommitted row.
func (r *forgetRace) forgetWhileHeld(consumer string, g1, g2 *raceGate) {
	r.t.Helper()
	var holder int32
	pgtest.Eventually(r.t, 30*time.Second, "the target's transaction to wait at the first gate", func() bool {
		var ok bool
		holder, ok = r.waiter(g1)
		return ok
	})
	type forgotten struct {
		res postgres.ForgetResult
		err error
	}
	forgot := make(chan forgotten, 1)
	go func() {
		res, err := r.store.Forget(r.ctx, postgres.SubjectRef{Tenant: "acme", ID: r.target})
		forgot <- forgotten{res, err}
	}()
	var f *forgotten
	pgtest.Eventually(r.t, 30*time.Second, "the forget to finish or wait for the held transaction", func() bool {
		select {
		case res := <-forgot:
			f = &res
			return true
		default:
		}
		return pgtest.BlockedBy(r.t, r.pool, int32(holder))
	})
	g1.release()
	if f != nil {
		if f.err != nil {
			r.t.Fatal(f.err)
		}
		r.forgottenAppliedBehind(consumer, g2, f.res.Event.Position)
	}
	g2.release()
	if f == nil {
		res := <-forgot
		if f = &res; f.err != nil {
			r.t.Fatal(f.err)
		}
	}
}

// forgetAcross forgets the target in a transaction that takes its
// transaction id (destroys the key, appends the forgotten event) before
// start starts a transaction of consumer (partitioned in 2) that reads the
// target's event, and commits while that transaction holds at g1, having
// read the name (the forget had not committed). A transaction that took
// its id before the forget's holds back every partition's reads of the
// log behind it (their horizon), so the forgotten event is applied after
// it commits; only one whose id is younger than the forget's can race it,
// which is what this arranges. Then g1 is given back, the transaction
// writes the name and holds at g2 until the subject's partition has
// applied the forgotten event, whose OnForgotten cannot see the
// uncommitted row.
func (r *forgetRace) forgetAcross(consumer string, g1, g2 *raceGate, start func()) {
	r.t.Helper()
	tx, err := r.pool.Begin(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(r.ctx) }()
	res, err := r.store.ForgetTx(r.ctx, tx, postgres.SubjectRef{Tenant: "acme", ID: r.target})
	if err != nil {
		r.t.Fatal(err)
	}
	start()
	pgtest.Eventually(r.t, 30*time.Second, "the target's transaction to wait at the first gate", func() bool {
		_, ok := r.waiter(g1)
		return ok
	})
	if err := tx.Commit(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	g1.release()
	r.forgottenAppliedBehind(consumer, g2, res.Event.Position)
	g2.release()
}

// forgottenAppliedBehind waits until the target's transaction holds at g2
// and the subject's partition of consumer (partitioned in 2) has applied
// the forgotten event at pos: the forget is applied behind the held
// transaction's back.
func (r *forgetRace) forgottenAppliedBehind(consumer string, g2 *raceGate, pos projector.Position) {
	r.t.Helper()
	pgtest.Eventually(r.t, 30*time.Second, "the target's transaction to wait at the second gate", func() bool {
		_, ok := r.waiter(g2)
		return ok
	})
	subject := projection.PartitionInstance(r.half(projector.SubjectStreamType, r.target), 2)
	pgtest.Eventually(r.t, 30*time.Second, "the subject's partition to apply the forgotten event", func() bool {
		st, err := projection.NewAdmin(r.store).Status(r.ctx, projection.ShardID{Consumer: consumer, Instance: subject})
		if err != nil {
			r.t.Fatal(err)
		}
		return !st.Cursor.Less(pos)
	})
}

// noNameAfterCatchUp fails the test if, once d has caught up, the read
// model holds the name of the forgotten target or of another of ids.
func (r *forgetRace) noNameAfterCatchUp(d *projection.Dispatcher, ids ...string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		r.t.Fatal(err)
	}
	rows, err := r.pool.Query(r.ctx, `SELECT name FROM `+r.customers+` WHERE customer_id = ANY($1) AND name IS NOT NULL AND name <> ''`,
		append(ids, r.target))
	if err != nil {
		r.t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.t.Fatal(err)
	}
	if len(names) != 0 {
		r.t.Fatalf("after the forget committed and every partition caught up, the read model holds the forgotten subject's name %q", names)
	}
}

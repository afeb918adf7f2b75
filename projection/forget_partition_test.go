package projection_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestPartitionedPassRacingForget: a partitioned async projection copies
// a customer's name into its read model and forgets subjects with
// OnForgotten. The customer's stream and the subject's stream (where the
// forgotten event goes) hash into different partitions. The pass of the
// customer's partition reads the customer's event with the key still
// there, and is held (in its handler, at an advisory lock the test holds)
// until the forget has committed; it then writes the name in the clear
// (its transaction id now younger than the forget's) and is held again
// while the other partition applies the forgotten event, whose
// OnForgotten cannot see the uncommitted row; then it commits. Promise 19
// (and 16: partitions keep every promise) says that after the forget no
// read model maintained through the forgotten event holds the name.
//
// It fails on the code of this commit: the read model keeps the name for
// good. A single shard applies both events in log order under one lock,
// so an unpartitioned consumer is not affected.
func TestPartitionedPassRacingForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types, store := partitionedPersonalStore(t)
	pool := store.Pool()
	schema := store.Schema()
	customers := pgx.Identifier{schema, "customers"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+customers+` (tenant_id text, customer_id text, name text)`); err != nil {
		t.Fatal(err)
	}
	// A customer whose stream and subject stream are in different halves.
	half := func(typ, id string) int {
		var h int64
		if err := pool.QueryRow(ctx, `SELECT `+pgx.Identifier{schema, "projector_stream_hash"}.Sanitize()+`($1, $2, $3)`,
			"acme", typ, id).Scan(&h); err != nil {
			t.Fatal(err)
		}
		return int(h >> 31)
	}
	var target string
	for i := 0; target == ""; i++ {
		if id := fmt.Sprintf("c-%d", i); half("customer", id) != half(projector.SubjectStreamType, id) {
			target = id
		}
	}
	gate1, gate2 := rand.Int64N(1<<62)+1, rand.Int64N(1<<62)+1
	p := projection.NewAsync("customers", projection.AsyncConfig{Partitions: 2, Tables: []string{schema + ".customers"}})
	must(projection.On(p, types.Registered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.CustomerRegistered) error {
		held := ev.Stream.ID == target && !ev.Forgotten
		if held {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, gate1); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+customers+` VALUES ($1, $2, $3)`, ev.Stream.Tenant, c.Customer, c.Name); err != nil {
			return err
		}
		if held {
			_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, gate2)
			return err
		}
		return nil
	}))
	must(projection.OnForgotten(p, projection.ForgetRows{Table: schema + ".customers", SubjectColumn: "customer_id", TenantColumn: "tenant_id"}))

	// The gates, each on a connection of its own, so each is given back
	// on its own and a pass waiting at it is found by its blocker.
	gates := make([]*struct {
		pid      uint32
		release  func()
		released bool
	}, 2)
	for i, key := range []int64{gate1, gate2} {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
			t.Fatal(err)
		}
		g := &struct {
			pid      uint32
			release  func()
			released bool
		}{pid: conn.Conn().PgConn().PID()}
		g.release = func() {
			if !g.released {
				g.released = true
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
					t.Error(err)
				}
				conn.Release()
			}
		}
		gates[i] = g
		defer g.release()
	}
	blockedBy := func(pid uint32) (int32, bool) {
		var waiter int32
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, int32(pid)).Scan(&waiter)
		return waiter, err == nil
	}

	d := (&env{t: t, ctx: ctx, store: store, schema: store.Schema()}).dispatcher(projection.Config{Projections: []*projection.Async{p}})
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", target), projector.AnyVersion,
			testevents.CustomerRegistered{Customer: target, Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var pass int32
	pgtest.Eventually(t, 30*time.Second, "the customer's pass to wait at the first gate", func() bool {
		var ok bool
		pass, ok = blockedBy(gates[0].pid)
		return ok
	})

	type forgotten struct {
		res postgres.ForgetResult
		err error
	}
	forgot := make(chan forgotten, 1)
	go func() {
		res, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: target})
		forgot <- forgotten{res, err}
	}()
	// The forget commits now, or waits for the pass (which a fix may
	// make it do).
	var f *forgotten
	pgtest.Eventually(t, 30*time.Second, "the forget to finish or wait for the pass", func() bool {
		select {
		case r := <-forgot:
			f = &r
			return true
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)))`, pass).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	gates[0].release()
	if f != nil {
		if f.err != nil {
			t.Fatal(f.err)
		}
		// The pass wrote the name, and waits again; the subject's
		// partition applies the forgotten event meanwhile.
		pgtest.Eventually(t, 30*time.Second, "the customer's pass to wait at the second gate", func() bool {
			_, ok := blockedBy(gates[1].pid)
			return ok
		})
		subject := projection.PartitionInstance(half(projector.SubjectStreamType, target), 2)
		pgtest.Eventually(t, 30*time.Second, "the subject's partition to apply the forgotten event", func() bool {
			st, err := projection.NewAdmin(store).Status(ctx, projection.ShardID{Consumer: "customers", Instance: subject})
			if err != nil {
				t.Fatal(err)
			}
			return !st.Cursor.Less(f.res.Event.Position)
		})
	}
	gates[1].release()
	if f == nil {
		r := <-forgot
		if f = &r; f.err != nil {
			t.Fatal(f.err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatal(err)
	}
	var names []string
	rows, err := pool.Query(ctx, `SELECT name FROM `+customers+` WHERE customer_id = $1 AND name IS NOT NULL AND name <> ''`, target)
	if err != nil {
		t.Fatal(err)
	}
	if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("after the forget committed and every partition caught up, the read model holds the forgotten subject's name %q", names)
	}
}

// TestPartitionedCatchesUpOverForgottenEventsWithoutValues: a forgotten
// subject's event that held no personal value (nothing was sealed, so it
// reads as not Forgotten) does not make a partition's pass read its batch
// again and again: the guard against forgets (forgetguard.go) only looks
// at subjects whose fields a handler was given opened. A guard that
// looked at every event of a forgotten subject rolled such a batch back
// for ever, and the consumer never caught up (CatchUp timed out).
func TestPartitionedCatchesUpOverForgottenEventsWithoutValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types, store := partitionedPersonalStore(t)
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", "c-1"), projector.AnyVersion,
			testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Plan: "pro"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// An event of the subject with no personal value at all (the Go type
	// always writes its fields, so it comes from a history file): nothing
	// of it is sealed, and it reads as not Forgotten after the forget.
	var file bytes.Buffer
	enc := postgres.NewHistoryEncoder(&file)
	if err := enc.Encode(postgres.HistoryEvent{
		Stream:  postgres.HistoryStream{Tenant: "acme", Type: "customer", ID: "c-1"},
		Version: 2, Type: "customer.registered", SchemaVersion: 1, ID: uuid.New(),
		RecordedAt: time.Now().UTC().Truncate(time.Microsecond), Payload: json.RawMessage(`{"customer":"c-1","plan":"free"}`),
	}); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Import(ctx, &file, postgres.ImportOptions{}); err != nil || res.Imported != 1 {
		t.Fatalf("import: %+v, %v", res, err)
	}
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	var seen, forgotten int
	var mu sync.Mutex
	p := projection.NewAsync("customers", projection.AsyncConfig{Partitions: 2})
	must(projection.On(p, types.Registered, func(_ context.Context, _ pgx.Tx, ev projector.Event, _ testevents.CustomerRegistered) error {
		mu.Lock()
		defer mu.Unlock()
		seen++
		if ev.Forgotten {
			forgotten++
		}
		return nil
	}))
	d := (&env{t: t, ctx: ctx, store: store, schema: store.Schema()}).dispatcher(projection.Config{Projections: []*projection.Async{p}})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatalf("catch up: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen != 2 || forgotten != 1 {
		t.Fatalf("handlers saw %d events, %d Forgotten; want 2, the one with a name Forgotten", seen, forgotten)
	}
}

// partitionedPersonalStore is a store of personal types, its master key
// set and the partition index made: what a partitioned consumer over
// personal data needs.
func partitionedPersonalStore(t *testing.T) (testevents.PersonalTypes, *postgres.Store) {
	t.Helper()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	if err := store.CreatePartitionIndex(context.Background()); err != nil {
		t.Fatal(err)
	}
	return types, store
}

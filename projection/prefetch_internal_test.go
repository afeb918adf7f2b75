package projection

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A pass takes its batch from the prefetch of the pass before only when the
// prefetch started at the cursor the pass holds and was full. Driven pass
// by pass: a moved cursor throws the prefetch away, and a late commit
// below a later transaction's events is delivered in log order, once,
// with prefetches running around it (promise 3).
func TestPrefetchGapSafe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	var seen []string
	p := NewAsync("prefetched", AsyncConfig{BatchSize: 2})
	if err := On(p, types.Commented, func(_ context.Context, _ pgx.Tx, ev projector.Event, c testevents.TicketCommented) error {
		seen = append(seen, c.Body)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d := registered(t, Config{Store: store, Projections: []*Async{p}, Concurrency: 1})
	sh := d.shards[0]
	appendIn := func(tx pgx.Tx, stream string, bodies ...string) {
		t.Helper()
		payloads := make([]any, len(bodies))
		for i, b := range bodies {
			payloads[i] = testevents.TicketCommented{Body: b}
		}
		if _, err := store.Append(ctx, tx, projector.Stream("ticket", stream), projector.ExactVersion(0), payloads...); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(stream string, bodies ...string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error { appendIn(tx, stream, bodies...); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	pass := func(want passKind) {
		t.Helper()
		res, err := d.pass(ctx, sh)
		if err != nil {
			t.Fatal(err)
		}
		if res.kind != want {
			t.Fatalf("pass: kind %d, want %d (seen %v)", res.kind, want, seen)
		}
		if sh.prefetch != nil {
			<-sh.prefetch.done // deterministic: the prefetch has read before the next step
		}
	}

	commit("a", "a1", "a2", "a3", "a4", "a5", "a6")
	waitHorizon(t, store)
	pass(passMore) // a1 a2, prefetching a3 a4
	pass(passMore) // a3 a4 from the prefetch, prefetching a5 a6
	if sh.prefetched != 1 {
		t.Fatalf("%d batches taken from a prefetch, want 1", sh.prefetched)
	}
	// An operator moves the cursor back to the start: the prefetch of a5 a6
	// no longer follows it and must not be applied.
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = $1`, sh.id.Consumer); err != nil {
		t.Fatal(err)
	}
	pass(passMore) // a1 a2 again, read afresh
	if sh.prefetched != 1 {
		t.Fatalf("a prefetch taken after the cursor moved (seen %v)", seen)
	}

	// A transaction with an older id than c's stays open while c commits:
	// its event is below c's in the log and must come first, once.
	late, err := store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	appendIn(late, "b", "b1")
	commit("c", "c1", "c2", "c3", "c4")
	pass(passMore) // a3 a4 from the prefetch; a5 a6 prefetched
	pass(passMore) // a5 a6 from the prefetch; the next prefetch finds nothing below the horizon
	pass(passCaughtUp)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitHorizon(t, store)
	for range 5 {
		if res, err := d.pass(ctx, sh); err != nil {
			t.Fatal(err)
		} else if res.kind == passCaughtUp {
			break
		}
		if sh.prefetch != nil {
			<-sh.prefetch.done
		}
	}
	want := []string{"a1", "a2", "a3", "a4", "a1", "a2", "a3", "a4", "a5", "a6", "b1", "c1", "c2", "c3", "c4"}
	if !slices.Equal(seen, want) {
		t.Fatalf("handled %v,\nwant    %v", seen, want)
	}
	if sh.prefetched < 4 {
		t.Fatalf("only %d batches taken from a prefetch: the test did not exercise it", sh.prefetched)
	}
}

// A prefetch still waiting for a pooled connection is not waited for: the
// pass that would wait may hold the connection it waits for (every pass of
// the pool's connections waiting on its prefetch, every prefetch on a
// connection, would stall the dispatcher). The pass reads itself instead.
func TestPrefetchWithoutAConnectionIsNotWaitedFor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	// A pool of its own: holding all of the shared pool's connections
	// would stall the package's other tests.
	store, err := postgres.New(ctx, pgtest.NewPool(t, 2), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	p := NewAsync("starved", AsyncConfig{BatchSize: 2})
	if err := On(p, types.Commented, func(context.Context, pgx.Tx, projector.Event, testevents.TicketCommented) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Store: store, Projections: []*Async{p}, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	sh := d.shards[0]
	// Hold every connection of the pool, as passes of other shards would.
	pool := store.Pool()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	q := postgres.LogQuery{After: projector.Start, Limit: 2, EventTypes: p.t.types, Raw: true}
	d.launchPrefetch(ctx, sh, q)
	waitCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, ok, _, err := d.takePrefetch(waitCtx, sh, q)
	if err != nil || ok {
		t.Fatalf("takePrefetch of a prefetch without a connection: ok %v, err %v; want no batch and no wait", ok, err)
	}
	d.wg.Wait() // the cancelled prefetch ends without a connection
}

// With two shards of one filter the prefetch goes through the shared
// reads: a shard's read-ahead serves the other shard's pass at that
// position, and each still takes only the batch at its own cursor. Driven
// pass by pass, around a late commit below later events (promise 3): each
// consumer handles every event once, in log order, and both prefetches
// were used.
func TestPrefetchThroughSharedReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	seen := map[string][]string{}
	var projs []*Async
	for _, name := range []string{"x", "y"} {
		p := NewAsync(name, AsyncConfig{BatchSize: 2})
		if err := On(p, types.Commented, func(_ context.Context, _ pgx.Tx, ev projector.Event, c testevents.TicketCommented) error {
			seen[name] = append(seen[name], c.Body)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		projs = append(projs, p)
	}
	d := registered(t, Config{Store: store, Projections: projs, Concurrency: 1})
	if d.shared == nil {
		t.Fatal("two shards of one filter, and no shared reads")
	}
	shards := map[string]*shard{}
	for _, sh := range d.shards {
		shards[sh.id.Consumer] = sh
	}
	appendIn := func(tx pgx.Tx, stream string, bodies ...string) {
		t.Helper()
		payloads := make([]any, len(bodies))
		for i, b := range bodies {
			payloads[i] = testevents.TicketCommented{Body: b}
		}
		if _, err := store.Append(ctx, tx, projector.Stream("ticket", stream), projector.ExactVersion(0), payloads...); err != nil {
			t.Fatal(err)
		}
	}
	pass := func(name string) passKind {
		t.Helper()
		sh := shards[name]
		res, err := d.pass(ctx, sh)
		if err != nil {
			t.Fatal(err)
		}
		if sh.prefetch != nil {
			<-sh.prefetch.done
		}
		return res.kind
	}
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error { appendIn(tx, "a", "a1", "a2", "a3", "a4", "a5", "a6"); return nil }); err != nil {
		t.Fatal(err)
	}
	waitHorizon(t, store)
	// x reads a1 a2 and prefetches a3 a4; y takes a1 a2 from x's read and
	// a3 a4 from x's prefetch for its own; then x is ahead of y.
	pass("x")
	pass("y")
	pass("x")
	pass("y")
	pass("x")
	// A transaction older than the next commit stays open: its event lies
	// below c's in the log and must come first, for both consumers.
	late, err := store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	appendIn(late, "b", "b1")
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error { appendIn(tx, "c", "c1", "c2"); return nil }); err != nil {
		t.Fatal(err)
	}
	pass("y")
	pass("x")
	pass("y")
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitHorizon(t, store)
	for _, name := range []string{"x", "y", "x", "y"} {
		for range 5 {
			if pass(name) == passCaughtUp {
				break
			}
		}
	}
	want := []string{"a1", "a2", "a3", "a4", "a5", "a6", "b1", "c1", "c2"}
	for _, name := range []string{"x", "y"} {
		if !slices.Equal(seen[name], want) {
			t.Errorf("%s handled %v,\nwant      %v", name, seen[name], want)
		}
		if shards[name].prefetched < 1 {
			t.Errorf("%s took no batch from a prefetch: the test did not exercise it", name)
		}
	}
}

// registered returns a dispatcher of cfg whose shards are registered but
// not started: a test drives its passes itself.
func registered(t *testing.T, cfg Config) *Dispatcher {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitHorizon waits for the cluster's horizon to pass every event committed
// so far: other tests' transactions hold it back for a while.
func waitHorizon(t *testing.T, store *postgres.Store) {
	t.Helper()
	ctx := context.Background()
	var newest uint64
	if err := store.Pool().QueryRow(ctx, `SELECT max(tx_id) FROM `+store.Table("projector_events")).Scan(&newest); err != nil {
		t.Fatal(err)
	}
	for {
		h, err := store.Horizon(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if h.TxID >= newest {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

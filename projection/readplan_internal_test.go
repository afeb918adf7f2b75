package projection

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestPartitionPassesPlanNeighbouringReads: once a partition has run for
// its planDelay, the connections its passes used carry the generic plans
// of the reads of the partitions it would split into and merge into, so
// that a split's halves and a merge's partition find them planned
// (readplan.go). A partition made moments ago plans nothing: that is the
// window of the change that made it.
func TestPartitionPassesPlanNeighbouringReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	shared := pgtest.Store(t, types.Registry)
	if err := shared.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	// A pool of its own: the connections the test looks at are the
	// dispatcher's alone (the test binary's pool serves parallel tests).
	// Room beyond what the dispatcher opens, for the new connection below.
	store, err := postgres.New(ctx, pgtest.NewPool(t, 16), postgres.Config{Schema: shared.Schema(), Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	p := NewAsync("plans", AsyncConfig{Partitions: 4})
	if err := On(p, types.Commented, func(context.Context, pgx.Tx, projector.Event, testevents.TicketCommented) error { return nil }); err != nil {
		t.Fatal(err)
	}
	streams := 16
	for i := range streams {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprint("t", i)), projector.ExactVersion(0), testevents.TicketCommented{Body: "x"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(Config{Store: store, Projections: []*Async{p}, Recheck: 20 * time.Millisecond, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	fresh := newPartitionShard(store.Schema(), p, d.balancers[0], postgres.Segment{Bits: 3, Value: 5})
	for _, b := range d.balancers {
		b.planDelay = 0
		for _, sh := range b.shards {
			sh.planFrom = time.Time{}
		}
	}
	var mu sync.Mutex
	caughtUp := map[ShardID]bool{}
	all := make(chan struct{})
	d.waiting = func(id ShardID, kind passKind) {
		mu.Lock()
		defer mu.Unlock()
		if kind == passCaughtUp && !caughtUp[id] {
			if caughtUp[id] = true; len(caughtUp) == 4 {
				close(all)
			}
		}
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(45 * time.Second):
		t.Fatal("timed out waiting for the 4 partitions to catch up")
	}
	stop, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := d.Stop(stop); err != nil { // waits for the planning too
		t.Fatal(err)
	}

	// Each connection's partition reads of this test's schema, by number
	// of buckets (branches):
	// 16 a partition of 4's own, 8 a half's, 32 a merged one's.
	conns := store.Pool().AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	read := 0
	for _, c := range conns {
		// This test's schema's reads: the pool is the test binary's.
		rows, err := c.Query(ctx, `SELECT statement, generic_plans FROM pg_prepared_statements
			WHERE strpos(statement, $1) > 0 AND statement NOT LIKE '%pg_prepared_statements%'`, pgx.Identifier{store.Schema()}.Sanitize()+".projector_stream_bucket(")
		if err != nil {
			t.Fatal(err)
		}
		generic := map[int]int64{}
		for rows.Next() {
			var sql string
			var n int64
			if err := rows.Scan(&sql, &n); err != nil {
				t.Fatal(err)
			}
			generic[strings.Count(sql, "projector_stream_bucket(")] += n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if generic[16] == 0 {
			continue // no pass read on it
		}
		read++
		if generic[8] == 0 || generic[32] == 0 {
			t.Errorf("a connection that ran a partition of 4's read (%d times) has the halves' read planned %d times and the merged read %d times: want both planned", generic[16], generic[8], generic[32])
		}
		for _, seg := range []postgres.Segment{{Bits: 3, Value: 1}, {Bits: 1}} {
			if !store.LogReadPlanned(c.Conn(), postgres.LogQuery{Partition: seg, EventTypes: p.t.types, Raw: true}) {
				t.Errorf("a connection that ran a partition of 4's read does not report the read of %s planned", seg)
			}
		}
	}
	if read == 0 {
		t.Fatal("no idle connection ran a partition's read")
	}
	if len(conns) > 0 {
		if qs := d.neighbourReads(conns[0], fresh, postgres.LogQuery{Partition: fresh.segment, EventTypes: p.t.types, Raw: true}); qs != nil {
			t.Fatalf("a partition made moments ago plans %d neighbouring reads, want none until its planDelay passed", len(qs))
		}
	}

	// A connection no pass used (here a new one; in production one the
	// probe or the application's writers used) is planned by the sweep of
	// the idle connections (planIdle), which plans the partitions' own
	// size too.
	if st := store.Pool().Stat(); st.TotalConns() >= st.MaxConns() {
		t.Fatalf("the dispatcher opened every connection of the pool (%d): no room for a new one", st.TotalConns())
	}
	opening, cancelOpen := context.WithTimeout(ctx, 20*time.Second)
	defer cancelOpen()
	extra, err := store.Pool().Acquire(opening) // every idle one is held above: a new connection
	if err != nil {
		t.Fatal(err)
	}
	pg := extra.Conn().PgConn()
	shapes := []postgres.Segment{{Bits: 2, Value: 1}, {Bits: 3, Value: 1}, {Bits: 1}}
	for _, seg := range shapes {
		if store.LogReadPlanned(extra.Conn(), postgres.LogQuery{Partition: seg, EventTypes: p.t.types, Raw: true}) {
			t.Fatalf("a new connection reports the read of %s planned", seg)
		}
	}
	extra.Release()
	d.planIdle(ctx, ctx)
	again := store.Pool().AcquireAllIdle(ctx)
	found := false
	for _, c := range again {
		if c.Conn().PgConn() != pg {
			continue
		}
		found = true
		for _, seg := range shapes {
			if !store.LogReadPlanned(c.Conn(), postgres.LogQuery{Partition: seg, EventTypes: p.t.types, Raw: true}) {
				t.Errorf("the sweep of the idle connections left the read of %s unplanned on one", seg)
			}
		}
	}
	conns = append(conns, again...)
	if !found {
		t.Fatal("the new connection is no longer in the pool")
	}
}
